/* stormgen: distinct-flow storms on loopback for the agent's cardinality tests.
 *
 *   stormgen refused A.B.C NADDR PORT_LO PORT_HI
 *       connect() to every port in [PORT_LO, PORT_HI] of A.B.C.1 .. A.B.C.NADDR (NADDR
 *       at most 254): each (address, port) is a flow of its own. A closed port answers
 *       with a reset at once (a failed connect); a port something listens on
 *       connects and is closed at once. Prints: refused=N connected=M
 *   stormgen accept A.B.C NADDR
 *       a listener on 0.0.0.0, then one short connection from the host to it through each
 *       address A.B.C.1 .. (NADDR up to 65024, the last two octets counting on): one
 *       byte each way, so every connection has bytes and an RTT sample.
 *       Prints: connections=N
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int listener, total;

static struct sockaddr_in addr_of(const char *prefix, int i, int port)
{
    char text[32];
    int a, b, c;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (sscanf(prefix, "%d.%d.%d", &a, &b, &c) != 3) {
        fprintf(stderr, "bad prefix %s\n", prefix);
        exit(2);
    }
    /* i counts from 0: host part 1..254, carried into the third octet */
    c += i / 254;
    snprintf(text, sizeof text, "%d.%d.%d.%d", a, b, c, i % 254 + 1);
    inet_pton(AF_INET, text, &sa.sin_addr);
    return sa;
}

static int refused(const char *prefix, int naddr, int lo, int hi)
{
    long nrefused = 0, nconnected = 0;
    for (int i = 0; i < naddr; i++) {
        for (int port = lo; port <= hi; port++) {
            struct sockaddr_in sa = addr_of(prefix, i, port);
            int s = socket(AF_INET, SOCK_STREAM, 0);
            if (s < 0) {
                perror("socket");
                return 1;
            }
            if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0)
                nconnected++;
            else if (errno == ECONNREFUSED)
                nrefused++;
            else {
                perror("connect");
                return 1;
            }
            close(s);
        }
    }
    printf("refused=%ld connected=%ld\n", nrefused, nconnected);
    return 0;
}

static void *serve(void *arg)
{
    char c;
    (void)arg;
    for (int i = 0; i < total; i++) {
        int s = accept(listener, 0, 0);
        if (s < 0)
            continue;
        if (read(s, &c, 1) == 1 && write(s, &c, 1) != 1) { /* the client went away */ }
        close(s);
    }
    return 0;
}

static int accepted(const char *prefix, int naddr)
{
    struct sockaddr_in any = {.sin_family = AF_INET};
    socklen_t len = sizeof any;
    pthread_t t;
    int one = 1;
    total = naddr;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, (struct sockaddr *)&any, sizeof any) || listen(listener, 4096) ||
        getsockname(listener, (struct sockaddr *)&any, &len)) {
        perror("listen");
        return 1;
    }
    pthread_create(&t, 0, serve, 0);
    long done = 0;
    for (int i = 0; i < naddr; i++) {
        struct sockaddr_in sa = addr_of(prefix, i, ntohs(any.sin_port));
        int s = socket(AF_INET, SOCK_STREAM, 0);
        char c = 'x';
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0 && write(s, &c, 1) == 1 &&
            read(s, &c, 1) == 1)
            done++;
        close(s);
    }
    pthread_join(t, 0);
    printf("connections=%ld\n", done);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "refused"))
        return refused(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 4 && !strcmp(argv[1], "accept"))
        return accepted(argv[2], atoi(argv[3]));
    fprintf(stderr, "usage: stormgen refused A.B.C NADDR PORT_LO PORT_HI | accept A.B.C NADDR\n");
    return 2;
}
