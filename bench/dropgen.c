/* dropgen: a storm of packets the kernel drops, as many a second as one CPU makes.
 *   dropgen ADDR PORT SECONDS RATE
 * Sends 65,507-byte UDP datagrams to ADDR:PORT for SECONDS, paced to RATE packets a second
 * (0: as fast as it goes). bench/drops.py routes ADDR through a veth of MTU 68 whose
 * neighbour resolution is switched off (no ARP probes): IP cuts each datagram into 1,365
 * fragments of 48 bytes and the kernel drops each one as it looks for the neighbour
 * (NEIGH_FAILED), in the sender's own send() and without an error, so one system call
 * makes 1,365 drops and nothing of the receive path runs. (1-byte datagrams to a closed
 * port, one syscall each and the whole send and receive path, reached 20,000 a second
 * here; a netfilter DROP in OUTPUT fails the send, one drop a syscall.)
 * Prints: sent=N datagrams=D fragments=F seconds=S rate=R (N: fragments made, one drop
 * each; F: fragments a datagram, from the route's MTU) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define LEN 65507 /* the largest UDP payload over IPv4 */

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
    int sndbuf = 64 << 20, pmtu = IP_PMTUDISC_DONT; /* fragment, never refuse */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf));
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst))) {
        perror("dropgen: connect");
        return 1;
    }
    int mtu = 0;
    socklen_t ml = sizeof(mtu);
    if (getsockopt(fd, IPPROTO_IP, IP_MTU, &mtu, &ml) || mtu < 68) {
        perror("dropgen: IP_MTU");
        return 1;
    }
    int per = ((mtu - 20) & ~7);                 /* payload bytes a fragment carries */
    long frags = (LEN + 8 + per - 1) / per;      /* the UDP header rides in the first */
    static char buf[LEN];
    long datagrams = 0, failed = 0;
    double start = now(), t = start;
    while ((t = now()) - start < seconds) {
        if (rate > 0 && datagrams * frags >= rate * (t - start))
            continue; /* ahead of the pace: spin (one CPU is the load's anyway) */
        if (send(fd, buf, LEN, 0) == LEN)
            datagrams++;
        else
            failed++;
    }
    double took = t - start;
    printf("sent=%ld datagrams=%ld fragments=%ld failed=%ld seconds=%.3f rate=%.0f\n",
           datagrams * frags, datagrams, frags, failed, took, datagrams * frags / took);
    return 0;
}
