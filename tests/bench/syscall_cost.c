/*
 * What one syscall costs (run by `openim-lab bench`, built there with `cc -O2`): times N calls
 * of one kind after N/10 warm-up calls and prints the nanoseconds per call on stdout.
 *
 *   syscall_cost devnull N      64-byte write(2)s to /dev/null (a hooked syscall, no socket)
 *   syscall_cost getppid N      getppid(2) (a syscall the observer does not hook)
 *   syscall_cost tcp N PORT     64-byte write(2)s on a new connection to 127.0.0.1:PORT (the
 *                               caller accepts and drains it)
 *
 * Raw syscall(2) calls so libc caching (getppid) or buffering never stands in for the kernel.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define WRITE_SIZE 64

static double now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e9 + (double)now.tv_nsec;
}

static int open_target(const char *mode, const char *port) {
    if (strcmp(mode, "devnull") == 0) {
        return open("/dev/null", O_WRONLY);
    }
    if (strcmp(mode, "tcp") == 0 && port != NULL) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in address = {0};
        address.sin_family = AF_INET;
        address.sin_port = htons((unsigned short)atoi(port));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
            return -1;
        }
        return fd;
    }
    return -1;
}

/* One call of the kind timed; returns 0 on success. */
static int call_once(int fd, const char *payload) {
    if (fd < 0) {
        syscall(SYS_getppid);
        return 0;
    }
    return syscall(SYS_write, fd, payload, WRITE_SIZE) == WRITE_SIZE ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s devnull|getppid|tcp CALLS [PORT]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long calls = atol(argv[2]);
    int fd = -1;
    if (strcmp(mode, "getppid") != 0) {
        fd = open_target(mode, argc > 3 ? argv[3] : NULL);
        if (fd < 0) {
            perror("syscall_cost: open or connect");
            return 1;
        }
    }
    if (calls < 1) {
        fprintf(stderr, "syscall_cost: CALLS must be at least 1\n");
        return 2;
    }
    char payload[WRITE_SIZE];
    memset(payload, 0x5a, sizeof payload);
    for (long call = 0; call < calls / 10; call++) {
        if (call_once(fd, payload) != 0) {
            perror("syscall_cost: warm-up call");
            return 1;
        }
    }
    double started = now_ns();
    for (long call = 0; call < calls; call++) {
        if (call_once(fd, payload) != 0) {
            perror("syscall_cost: timed call");
            return 1;
        }
    }
    double elapsed = now_ns() - started;
    printf("%.1f\n", elapsed / (double)calls);
    if (fd >= 0) {
        close(fd);
    }
    return 0;
}
