package serving

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// What an ordinary user's steps come to: two that need capabilities it
// lacks, one done.
var userSteps = []swapsafe.Step{
	{Name: "mlockall", Err: errors.New("not attempted: RLIMIT_MEMLOCK is 8388608 bytes"), Hint: "LimitMEMLOCK=infinity"},
	{Name: "oom_score_adj", Err: errors.New("permission denied")},
	{Name: "go_memory_limit", Done: "536870912 bytes"},
}

func reportAt(t *testing.T, level slog.Level, cfg *Config) (string, []string) {
	t.Helper()
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: level}))
	failed := reportSteps(log, cfg, userSteps, false)
	return b.String(), failed
}

// A plain export, as a newcomer tries gzramd without root, says in one
// INFO line what it goes without, and each step only at DEBUG.
func TestReportStepsPlainExport(t *testing.T) {
	cfg := &Config{Realtime: "auto"}
	out, failed := reportAt(t, slog.LevelInfo, cfg)
	if strings.Join(failed, ",") != "mlockall,oom_score_adj" {
		t.Errorf("failed = %v", failed)
	}
	if strings.Contains(out, "level=WARN") {
		t.Errorf("a plain export warns:\n%s", out)
	}
	summary := strings.Count(out, "hardening steps skipped; fine for trying gzramd, not for swap")
	if summary != 1 || !strings.Contains(out, "skipped=mlockall,oom_score_adj") || !strings.Contains(out, "msg=hardening step=go_memory_limit done=") {
		t.Errorf("want one INFO line naming both skipped steps, and the done one:\n%s", out)
	}
	if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n != 2 {
		t.Errorf("%d lines at INFO, want 2:\n%s", n, out)
	}
	debug, _ := reportAt(t, slog.LevelDebug, cfg)
	for _, step := range []string{"mlockall", "oom_score_adj"} {
		if !strings.Contains(debug, `level=DEBUG msg="hardening step failed; gzramd serves without it (it matters while the export is swap)" step=`+step+" ") {
			t.Errorf("no DEBUG line for %s:\n%s", step, debug)
		}
	}
}

// Where the export is swap, each step that failed is a WARN of its own,
// with what serving swap risks without it.
func TestReportStepsForSwap(t *testing.T) {
	for _, cfg := range []*Config{{Swap: true}, {Device: "/dev/nbd0"}, {Realtime: "on"}, {RequireHardening: true}} {
		out, _ := reportAt(t, slog.LevelInfo, cfg)
		if n := strings.Count(out, "level=WARN"); n != 2 || strings.Contains(out, "fine for trying") {
			t.Errorf("swap %v, device %q, realtime %q: %d WARN lines, want one per failed step and no summary:\n%s", cfg.Swap, cfg.Device, cfg.Realtime, n, out)
		}
		if !strings.Contains(out, `without_it="gzramd's own memory may be reclaimed`) || !strings.Contains(out, `hint="LimitMEMLOCK=infinity"`) {
			t.Errorf("swap %v, device %q, realtime %q: a WARN lacks what is at risk or the hint:\n%s", cfg.Swap, cfg.Device, cfg.Realtime, out)
		}
	}
}

// A standby says again what its serving process said: for a plain export,
// all of it at DEBUG; for swap its failures still warn.
func TestReportStepsStandby(t *testing.T) {
	for _, c := range []struct {
		cfg   *Config
		lines int
	}{{&Config{Realtime: "auto"}, 0}, {&Config{Swap: true}, 3}} {
		var b bytes.Buffer
		log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo}))
		reportSteps(log, c.cfg, userSteps, true)
		out := strings.TrimSpace(b.String())
		n := 0
		if out != "" {
			n = strings.Count(out, "\n") + 1
		}
		if n != c.lines {
			t.Errorf("swap %v: the standby logged %d lines at INFO and above, want %d:\n%s", c.cfg.Swap, n, c.lines, out)
		}
	}
}
