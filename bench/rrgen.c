/* rrgen: few connections, many messages (GPU nodes' traffic shape), on loopback.
 *   rrgen rr ADDR SECONDS CONNS SIZE     request/response: each connection sends SIZE
 *                                        bytes and waits for SIZE back, again and again
 *   rrgen stream ADDR SECONDS CONNS SIZE a one-way stream of SIZE-byte writes per
 *                                        connection, read as they come
 * Each connection is a client thread and a server thread of its own.
 * Prints: messages=N seconds=S rate=R (rate: messages per second, all connections)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int listener, size, rr;
static struct sockaddr_in dst;
static atomic_long done;
static atomic_int stop;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int full(int fd, char *buf, int n, int writing)
{
    int got = 0;
    while (got < n) {
        int r = writing ? write(fd, buf + got, n - got) : read(fd, buf + got, n - got);
        if (r <= 0)
            return -1;
        got += r;
    }
    return 0;
}

static void *serve(void *arg)
{
    int c = (int)(long)arg;
    char *buf = malloc(size > 65536 ? size : 65536);
    for (;;) {
        if (rr) {
            if (full(c, buf, size, 0) || full(c, buf, size, 1))
                break;
        } else if (read(c, buf, 65536) <= 0) {
            break;
        }
    }
    close(c);
    free(buf);
    return 0;
}

static void *client(void *arg)
{
    char *buf = calloc(1, size);
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    (void)arg;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (struct sockaddr *)&dst, sizeof dst)) {
        perror("connect");
        exit(1);
    }
    while (!atomic_load(&stop)) {
        if (full(s, buf, size, 1) || (rr && full(s, buf, size, 0)))
            break;
        atomic_fetch_add(&done, 1);
    }
    shutdown(s, SHUT_WR);
    close(s);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[1], "rr") && strcmp(argv[1], "stream"))) {
        fprintf(stderr, "usage: rrgen rr|stream ADDR SECONDS CONNS SIZE\n");
        return 2;
    }
    rr = !strcmp(argv[1], "rr");
    double seconds = atof(argv[3]);
    int conns = atoi(argv[4]);
    size = atoi(argv[5]);
    struct sockaddr_in any = {.sin_family = AF_INET};
    socklen_t len = sizeof any;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(listener, (struct sockaddr *)&any, sizeof any) || listen(listener, 128) ||
        getsockname(listener, (struct sockaddr *)&any, &len)) {
        perror("listen");
        return 1;
    }
    dst.sin_family = AF_INET;
    dst.sin_port = any.sin_port;
    inet_pton(AF_INET, argv[2], &dst.sin_addr);
    pthread_t *threads = calloc(2 * conns, sizeof(pthread_t));
    for (int i = 0; i < conns; i++) {
        pthread_create(&threads[2 * i], 0, client, 0);
        int c = accept(listener, 0, 0);
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_create(&threads[2 * i + 1], 0, serve, (void *)(long)c);
    }
    double t0 = now();
    long start = atomic_load(&done);
    while (now() - t0 < seconds)
        usleep(10000);
    long n = atomic_load(&done) - start;
    double took = now() - t0;
    atomic_store(&stop, 1);
    for (int i = 0; i < 2 * conns; i++)
        pthread_join(threads[i], 0);
    printf("messages=%ld seconds=%.3f rate=%.0f\n", n, took, n / took);
    return 0;
}
