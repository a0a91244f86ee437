package testneeds

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// skipRecorder is a testing.TB whose Skip and Fatal are recorded rather
// than ending the test.
type skipRecorder struct {
	testing.TB
	skipped, fatal string
}

func (r *skipRecorder) Helper()                           {}
func (r *skipRecorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *skipRecorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }

// An mlock refused by the memlock limit skips as a need of kind limit,
// which the summary of make test turns into the fix; any other error fails.
func TestMlockRefused(t *testing.T) {
	for _, err := range []error{unix.ENOMEM, fmt.Errorf("mlock of the heap at 0x1-0x2: %w", unix.EPERM)} {
		r := &skipRecorder{TB: t}
		MlockRefused(r, err, "locking the heap")
		if !strings.HasPrefix(r.skipped, "needs limit memlock: locking the heap: refused (") || !strings.Contains(r.skipped, "(ulimit -l)") || r.fatal != "" {
			t.Errorf("MlockRefused(%v): skipped %q, fatal %q", err, r.skipped, r.fatal)
		}
	}
	r := &skipRecorder{TB: t}
	MlockRefused(r, unix.EINVAL, "mlock")
	if r.skipped != "" || r.fatal == "" {
		t.Errorf("MlockRefused(EINVAL): skipped %q, want a failure", r.skipped)
	}
	r = &skipRecorder{TB: t}
	MlockRefused(r, nil, "mlock")
	if r.skipped != "" || r.fatal != "" {
		t.Errorf("MlockRefused(nil): skipped %q, fatal %q", r.skipped, r.fatal)
	}
}

// Memlock asks nothing of a limit that allows the amount.
func TestMemlockWithinTheLimit(t *testing.T) {
	r := &skipRecorder{TB: t}
	Memlock(r, 0, "nothing")
	if r.skipped != "" {
		t.Errorf("Memlock of 0 bytes skipped: %q", r.skipped)
	}
}
