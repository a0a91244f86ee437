// Package testneeds skips a test, or says what part of it did not run,
// in words that name what is missing and how to get it. Each message reads
// "needs KIND [NAME]: DETAIL", which internal/testreport groups into the
// summary that ends make test: a newcomer reads what did not run and
// the one command that would run it, instead of "ok".
package testneeds

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/corpus"
)

// The kinds of need, as the summary groups them.
const (
	// KindPackage is a Debian package (NAME) that apt-get installs.
	KindPackage = "package"
	// KindCorpus is the corpus of real memory pages (internal/corpus).
	KindCorpus = "corpus"
	// KindModule is a kernel module (NAME) that modprobe loads.
	KindModule = "module"
	// KindRoot is root, or a capability root has.
	KindRoot = "root"
	// KindLimit is a resource limit (NAME, as ulimit names it: memlock)
	// higher than this user's: root may raise it, or run the test.
	KindLimit = "limit"
	// KindOptIn is an environment variable (NAME) that turns on a test
	// too slow, too heavy or too specific for every run.
	KindOptIn = "opt-in"
	// KindMachine is something this machine or kernel lacks that no
	// command here gives it (a GPU, a little-endian CPU, a kernel feature).
	KindMachine = "machine"
	// KindHelper marks a test that is the body of a process another test
	// starts: it runs there, not on its own.
	KindHelper = "helper"
)

// Message is the text of a need: "needs KIND NAME: DETAIL", or without
// NAME where it is empty.
func Message(kind, name, detail string) string {
	if name == "" {
		return fmt.Sprintf("needs %s: %s", kind, detail)
	}
	return fmt.Sprintf("needs %s %s: %s", kind, name, detail)
}

// PartPrefix begins the log line of a test that ran without one of its
// checks (Part).
const PartPrefix = "did not check all: "

// Skip skips the test for want of kind NAME.
func Skip(tb testing.TB, kind, name, format string, args ...any) {
	tb.Helper()
	tb.Skip(Message(kind, name, fmt.Sprintf(format, args...)))
}

// Part logs that a part of the test did not run for want of kind NAME;
// the test goes on with the rest, and the summary counts it.
func Part(tb testing.TB, kind, name, format string, args ...any) {
	tb.Helper()
	tb.Log(PartPrefix + Message(kind, name, fmt.Sprintf(format, args...)))
}

// Command returns the path of the command name, or skips the test: it
// comes in the Debian package pkg.
func Command(tb testing.TB, name, pkg string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Skip(tb, KindPackage, pkg, "%s not installed (apt-get install %s)", name, pkg)
	}
	return p
}

// CommandFor returns the path of the command name and true, or logs that
// the part of the test that needs it (what) did not run, and returns false.
func CommandFor(tb testing.TB, name, pkg, what string) (string, bool) {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Part(tb, KindPackage, pkg, "%s not installed (apt-get install %s): %s", name, pkg, what)
		return "", false
	}
	return p, true
}

// Env returns the value of the environment variable name, or skips the
// test, which runs only when it is set: what says what the test does.
func Env(tb testing.TB, name, what string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		Skip(tb, KindOptIn, name, "%s (set %s to run it)", what, name)
	}
	return v
}

// Root skips the test unless it runs as root: what says what needs it.
func Root(tb testing.TB, what string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Skip(tb, KindRoot, "", "%s needs root", what)
	}
}

// Memlock skips the test unless this process may lock n bytes of memory:
// it has CAP_IPC_LOCK, or its memlock limit (RLIMIT_MEMLOCK; Debian's
// default for a user is 8 MiB) allows n. n < 0 asks for an unlimited
// limit, as mlockall of future memory does. what says what needs it.
func Memlock(tb testing.TB, n int64, what string) {
	tb.Helper()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return // the test finds out for itself
	}
	if lim.Cur == unix.RLIM_INFINITY || (n >= 0 && lim.Cur >= uint64(n)) || hasCapIPCLock() {
		return
	}
	need := "an unlimited memlock limit"
	if n >= 0 {
		need = fmt.Sprintf("%d MiB locked", (n+1<<20-1)>>20)
	}
	Skip(tb, KindLimit, "memlock", "%s needs %s; this user's limit is %d KiB (ulimit -l), without CAP_IPC_LOCK", what, need, lim.Cur>>10)
}

// MlockRefused skips the test when err, from mlock or mlockall, is the
// memlock limit's refusal (ENOMEM or EPERM): what says what needs it. Any
// other error fails the test.
func MlockRefused(tb testing.TB, err error, what string) {
	tb.Helper()
	if err == nil {
		return
	}
	if !errors.Is(err, unix.ENOMEM) && !errors.Is(err, unix.EPERM) {
		tb.Fatalf("%s: %v", what, err)
		return
	}
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
	Skip(tb, KindLimit, "memlock", "%s: refused (%v); this user's limit is %d KiB (ulimit -l), without CAP_IPC_LOCK", what, err, lim.Cur>>10)
}

// hasCapIPCLock reports whether CAP_IPC_LOCK (bit 14) is in the effective
// set, which lifts the memlock limit.
func hasCapIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<14) != 0
		}
	}
	return false
}

// Machine skips the test: this machine lacks what it needs, and no
// command here gives it.
func Machine(tb testing.TB, format string, args ...any) {
	tb.Helper()
	Skip(tb, KindMachine, "", format, args...)
}

// Helper skips a test that is the body of a process that parent (a test
// name) starts, when it runs on its own.
func Helper(tb testing.TB, parent string) {
	tb.Helper()
	Skip(tb, KindHelper, "", "the body of a process %s starts", parent)
}

// CorpusMissing is the detail of a corpus skip: what the corpus is, and
// the two ways to have one.
const CorpusMissing = "memory-pages.bin.zst, real anonymous memory pages (4 KiB each) " +
	"that the ratio, codec and store tests read, was not found: capture one from this machine's memory " +
	"(as root: go run ./internal/corpus/capture -o /tmp/memory-pages.bin.zst), or take the project's " +
	"where you have it (../shared/corpus/ beside the repository on the project's machines), " +
	"and set " + corpus.EnvPath + " to its path (README: The corpus)"

var corpusOnce struct {
	sync.Once
	pages []byte
	err   error
}

// Corpus returns the corpus's pages, loaded once per test binary, or
// skips the test when there is none.
func Corpus(tb testing.TB) []byte {
	tb.Helper()
	if pages := CorpusOr(tb, ""); pages != nil {
		return pages
	}
	Skip(tb, KindCorpus, "", CorpusMissing)
	return nil
}

// CorpusOr returns the corpus's pages, like Corpus, or, when there is
// none, nil, having said what the test does instead (Part), for a test
// that can go on without them.
func CorpusOr(tb testing.TB, instead string) []byte {
	tb.Helper()
	corpusOnce.Do(func() { corpusOnce.pages, corpusOnce.err = corpus.Load("") })
	if errors.Is(corpusOnce.err, corpus.ErrNotFound) {
		if instead != "" {
			Part(tb, KindCorpus, "", "%s; %s", CorpusMissing, instead)
		}
		return nil
	}
	if corpusOnce.err != nil {
		tb.Fatal(corpusOnce.err)
	}
	return corpusOnce.pages
}
