package osthread

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

func TestRunNamesAThreadOtherThanMain(t *testing.T) {
	main, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		testneeds.Machine(t, "/proc/self/comm, a thread's name (Linux 2.6.33 and later, /proc mounted): %v", err)
	}
	for range 20 { // whichever thread the goroutine starts on
		var tid int
		var comm []byte
		Run("gz-test", func() {
			tid = unix.Gettid()
			comm, _ = os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/comm")
		})
		if tid == unix.Getpid() {
			t.Fatal("ran on the main thread")
		}
		if got := strings.TrimSpace(string(comm)); got != "gz-test" {
			t.Fatalf("thread %d is named %q", tid, got)
		}
	}
	if now, _ := os.ReadFile("/proc/self/comm"); string(now) != string(main) {
		t.Errorf("the process was renamed from %q to %q", main, now)
	}
}
