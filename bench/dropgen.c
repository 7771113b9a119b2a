/* dropgen: a storm of packets the kernel drops: UDP datagrams to a port nobody listens on.
 *   dropgen ADDR PORT SECONDS RATE
 * sendmmsg() batches of 1-byte datagrams to ADDR:PORT for SECONDS, paced to RATE a second
 * (0: as fast as it goes). Each one the kernel accepts is dropped on the receive side
 * (NO_SOCKET, or CPU_BACKLOG when loopback's backlog overflows).
 * Prints: sent=N seconds=S rate=R */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 256

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: dropgen ADDR PORT SECONDS RATE\n");
        return 2;
    }
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &dst.sin_addr);
    double seconds = atof(argv[3]), rate = atof(argv[4]);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    static char byte = 'x';
    static struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    static struct mmsghdr msgs[BATCH];
    for (int i = 0; i < BATCH; i++) {
        msgs[i].msg_hdr.msg_name = &dst;
        msgs[i].msg_hdr.msg_namelen = sizeof(dst);
        msgs[i].msg_hdr.msg_iov = &iov;
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    long sent = 0;
    double start = now(), t = start;
    while ((t = now()) - start < seconds) {
        if (rate > 0 && sent >= rate * (t - start))
            continue; /* ahead of the pace: spin (one CPU is the load's anyway) */
        int n = sendmmsg(fd, msgs, BATCH, 0);
        if (n > 0)
            sent += n;
    }
    printf("sent=%ld seconds=%.3f rate=%.0f\n", sent, t - start, sent / (t - start));
    return 0;
}
