/*
 * httpget IP:PORT PATH: prints the body of an HTTP/1.0 GET. The guest
 * needs it because busybox-static's wget crashes (static glibc cannot
 * load its resolver); this one takes a numeric address and resolves
 * nothing. Exits 1 on any error or a status other than 200.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: httpget IP:PORT PATH\n");
		return 2;
	}
	char host[64];
	snprintf(host, sizeof host, "%s", argv[1]);
	char *colon = strrchr(host, ':');
	if (!colon) {
		fprintf(stderr, "httpget: %s: want IP:PORT\n", argv[1]);
		return 2;
	}
	*colon = 0;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "httpget: %s: not an IPv4 address\n", host);
		return 2;
	}
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct timeval tv = {.tv_sec = 10};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		perror("httpget: connect");
		return 1;
	}
	char req[512];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", argv[2], argv[1]);
	if (write(fd, req, n) != n) {
		perror("httpget: write");
		return 1;
	}
	/* Read the whole reply, then print what follows the header. */
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap + 1);
	ssize_t r;
	while (buf && (r = read(fd, buf + len, cap - len)) > 0) {
		len += r;
		if (len == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
	}
	if (!buf) {
		fprintf(stderr, "httpget: out of memory\n");
		return 1;
	}
	buf[len] = 0;
	if (strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 8, " 200", 4) != 0) {
		fprintf(stderr, "httpget: bad reply: %.60s\n", buf);
		return 1;
	}
	char *body = strstr(buf, "\r\n\r\n");
	if (!body) {
		fprintf(stderr, "httpget: no end of header\n");
		return 1;
	}
	body += 4;
	fwrite(body, 1, len - (body - buf), stdout);
	return 0;
}
