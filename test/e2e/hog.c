/*
 * hog: fills more memory than the guest has with a pattern that names
 * its own place (page index, word index, seed), then reads every word
 * back twice. Any page the swap device loses, corrupts, misplaces or
 * serves stale from an earlier run shows up as a wrong word.
 *
 * Usage: hog MIB SEED [RANDOM_EVERY]   (default 8; 0: no random pages)
 * With HOG_PEAK_CMD set, runs it with /bin/sh once every page is written
 * (the moment most of the hog is in swap), e.g. to scrape metrics.
 * With HOG_HOLD set, holds the pages written until SIGTERM and verifies
 * them then: data kept in swap across something (a reboot's shutdown).
 * With HOG_UNTIL_FILE set, goes on verifying, pass after pass, until that
 * file exists, for at most HOG_MAX_PASSES passes (default 12): the survive
 * scenario keeps the swapping going until its killer has done what it
 * was asked, however slow the machine.
 * Prints "HOG-PASS" or "HOG-FAIL ..." and exits 0 or 1.
 * Built with gcc -static so the initramfs needs no libc for it.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

enum { PAGE = 4096, WORDS = PAGE / 8 };

/*
 * The first word of each 64-byte line holds, little-endian, 2 bytes of
 * seed, 2 of the word's index and 4 of the page's index; the other seven
 * repeat a word made of page and seed. So a page compresses well (the
 * daemon's "compressed below original" metric, and gzramd inside the
 * guest, which keeps compressed pages in the guest's own RAM, need that)
 * while any misplaced line, page or stale run shows. Every RANDOM_EVERY-th
 * page is random-looking instead, so incompressible pages travel too.
 */
static uint64_t random_every = 8;

static uint64_t pattern(uint64_t seed, uint64_t page, uint64_t word)
{
	uint64_t v = (page << 32) | (seed & 0xffff);
	if (word % 8 == 0)
		v |= (word & 0xffff) << 16;
	else
		v |= 0xa5a5ull << 16;
	if (random_every && page % random_every == random_every - 1) {
		uint64_t z = v ^ (word << 48) ^ (seed * 0x9e3779b97f4a7c15ull);
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		v = z ^ (z >> 31);
	}
	return v;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t verify(volatile uint64_t *mem, uint64_t pages, uint64_t seed, int pass)
{
	uint64_t bad = 0;
	/* Pass 2 walks backwards so pages come in from swap in another order. */
	for (uint64_t i = 0; i < pages; i++) {
		uint64_t p = pass == 1 ? i : pages - 1 - i;
		for (uint64_t w = 0; w < WORDS; w++) {
			uint64_t got = mem[p * WORDS + w], want = pattern(seed, p, w);
			if (got != want) {
				if (bad < 8)
					printf("hog: pass %d: page %" PRIu64 " word %" PRIu64
					       ": got %016" PRIx64 " want %016" PRIx64 "\n",
					       pass, p, w, got, want);
				bad++;
			}
		}
	}
	return bad;
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: hog MIB SEED [RANDOM_EVERY]\n");
		return 2;
	}
	if (argc == 4)
		random_every = strtoull(argv[3], NULL, 10);
	uint64_t mib = strtoull(argv[1], NULL, 10), seed = strtoull(argv[2], NULL, 10);
	uint64_t pages = mib * 1024 * 1024 / PAGE;
	if (pages == 0) {
		fprintf(stderr, "hog: MIB must be positive\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *hold = getenv("HOG_HOLD");
	sigset_t term;
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	/* Blocked from the start: a SIGTERM while writing waits its turn. */
	if (hold && *hold)
		sigprocmask(SIG_BLOCK, &term, NULL);
	volatile uint64_t *mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED) {
		perror("hog: mmap");
		printf("HOG-FAIL mmap\n");
		return 1;
	}
	double t0 = now();
	for (uint64_t p = 0; p < pages; p++) {
		for (uint64_t w = 0; w < WORDS; w++)
			mem[p * WORDS + w] = pattern(seed, p, w);
		if ((p + 1) % (pages / 4 ? pages / 4 : 1) == 0)
			printf("hog: wrote %" PRIu64 " of %" PRIu64 " MiB (%.1f s)\n",
			       (p + 1) * PAGE >> 20, mib, now() - t0);
	}
	/* HOG_WROTE_FILE tells the survive scenario's killer that the write
	 * phase is over (it keeps kills for the verify phase). */
	const char *wrote = getenv("HOG_WROTE_FILE");
	if (wrote && *wrote) {
		int fd = open(wrote, O_CREAT | O_WRONLY, 0644);
		if (fd >= 0)
			close(fd);
	}
	const char *peak = getenv("HOG_PEAK_CMD");
	if (peak && *peak) {
		/* posix_spawn uses vfork: no copy of the hog's page tables. */
		char *args[] = {"sh", "-c", (char *)peak, NULL};
		pid_t pid;
		int status;
		if (posix_spawn(&pid, "/bin/sh", NULL, NULL, args, environ) == 0)
			waitpid(pid, &status, 0);
		else
			perror("hog: HOG_PEAK_CMD");
	}
	if (hold && *hold) {
		int sig;
		printf("HOG-HOLDING %" PRIu64 " MiB until SIGTERM\n", mib);
		sigwait(&term, &sig);
		printf("hog: SIGTERM: verifying what was held (%.1f s)\n", now() - t0);
	}
	const char *until = getenv("HOG_UNTIL_FILE");
	const char *most = getenv("HOG_MAX_PASSES");
	int max_passes = most && *most ? atoi(most) : 12;
	uint64_t total = 0;
	int pass = 1;
	for (;; pass++) {
		uint64_t bad = verify(mem, pages, seed, pass);
		printf("hog: verify pass %d: %" PRIu64 " wrong words of %" PRIu64 " (%.1f s)\n",
		       pass, bad, pages * WORDS, now() - t0);
		total += bad;
		if (pass < 2)
			continue;
		if (!until || !*until || pass >= max_passes || access(until, F_OK) == 0)
			break;
	}
	if (total) {
		printf("HOG-FAIL %" PRIu64 " wrong words\n", total);
		return 1;
	}
	printf("HOG-PASS %" PRIu64 " MiB verified %d times\n", mib, pass);
	return 0;
}
