/* conngen: loopback TCP connection load with its own listener.
 *   conngen ADDR SECONDS CLIENTS [PAYLOAD] [SRC|-] [RATE]
 * Client threads connect, send PAYLOAD bytes, read them back and close, for SECONDS;
 * with RATE, at most RATE connections per second in all (paced per client).
 * Prints: connections=N seconds=S rate=R port=P */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int listener;
static struct sockaddr_in dst, src;
static int payload = 64, use_src;
static double interval; /* seconds between one client's connections; 0: no pacing */
static atomic_long done;
static atomic_int stop;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *serve(void *arg)
{
    char buf[65536];
    (void)arg;
    for (;;) {
        int c = accept(listener, 0, 0);
        if (c < 0)
            continue;
        int got = 0, n;
        while (got < payload && (n = read(c, buf, sizeof buf)) > 0)
            got += n;
        if (write(c, buf, got) < 0) { /* the client went away */ }
        close(c);
    }
    return 0;
}

static void *client(void *arg)
{
    char buf[65536];
    int one = 1;
    (void)arg;
    memset(buf, 'x', sizeof buf);
    double next = now();
    while (!atomic_load(&stop)) {
        if (interval > 0) {
            double wait = next - now();
            if (wait > 0)
                usleep((useconds_t)(wait * 1e6));
            next += interval;
        }
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (use_src) {
            setsockopt(s, IPPROTO_IP, 24 /* IP_BIND_ADDRESS_NO_PORT */, &one, sizeof one);
            bind(s, (struct sockaddr *)&src, sizeof src);
        }
        if (connect(s, (struct sockaddr *)&dst, sizeof dst) == 0 &&
            write(s, buf, payload) == payload) {
            int got = 0, n;
            while (got < payload && (n = read(s, buf, sizeof buf)) > 0)
                got += n;
            if (got == payload)
                atomic_fetch_add(&done, 1);
        }
        close(s);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: conngen ADDR SECONDS CLIENTS [PAYLOAD] [SRC|-] [RATE]\n");
        return 2;
    }
    double seconds = atof(argv[2]);
    int clients = atoi(argv[3]);
    if (argc > 4)
        payload = atoi(argv[4]);
    dst.sin_family = AF_INET;
    inet_pton(AF_INET, argv[1], &dst.sin_addr);
    if (argc > 6 && atof(argv[6]) > 0)
        interval = clients / atof(argv[6]);
    if (argc > 5 && strcmp(argv[5], "-") != 0) {
        src.sin_family = AF_INET;
        inet_pton(AF_INET, argv[5], &src.sin_addr);
        use_src = 1;
    }
    listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, (struct sockaddr *)&dst, sizeof dst) || listen(listener, 4096)) {
        perror("listen");
        return 1;
    }
    socklen_t len = sizeof dst;
    getsockname(listener, (struct sockaddr *)&dst, &len);
    pthread_t t;
    for (int i = 0; i < 2; i++)
        pthread_create(&t, 0, serve, 0);
    pthread_t *ct = calloc(clients, sizeof *ct);
    double start = now();
    for (int i = 0; i < clients; i++)
        pthread_create(&ct[i], 0, client, 0);
    while (now() - start < seconds)
        usleep(10000);
    atomic_store(&stop, 1);
    for (int i = 0; i < clients; i++)
        pthread_join(ct[i], 0);
    double took = now() - start;
    long n = atomic_load(&done);
    printf("connections=%ld seconds=%.3f rate=%.0f port=%d\n", n, took, n / took,
           ntohs(dst.sin_port));
    return 0;
}
