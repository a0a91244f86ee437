package supervise

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestFromEnv: what a supervisor sets is what a serving process reads, a
// standby's start environment once its go has come.
func TestFromEnv(t *testing.T) {
	for _, k := range []string{EnvServing, EnvSupervisor, EnvStandby, EnvTakeovers, EnvDiedAt, EnvHandedOver, EnvStopping, EnvParentDeath, EnvHandover, EnvLifeline} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	if s := FromEnv(); s.Serving || s.Released || s.SupervisorAlive() || s.handover != -1 || s.lifeline != -1 {
		t.Fatalf("without a supervisor: %+v", s)
	}
	t.Setenv(EnvServing, "1")
	t.Setenv(EnvSupervisor, strconv.Itoa(os.Getppid()))
	t.Setenv(EnvStandby, "1")
	t.Setenv(EnvParentDeath, strconv.Itoa(int(syscall.SIGKILL)))
	t.Setenv(EnvHandover, "7")
	s := FromEnv()
	if !s.Serving || !s.Standby || s.Released || !s.SupervisorAlive() || s.ParentDeath != syscall.SIGKILL || s.handover != 7 {
		t.Fatalf("a standby before its go: %+v", s)
	}
	died := time.Unix(0, 1764130000123456789)
	t.Setenv(EnvTakeovers, "3")
	t.Setenv(EnvDiedAt, strconv.FormatInt(died.UnixNano(), 10))
	t.Setenv(EnvStopping, "1")
	s = FromEnv()
	if !s.Released || s.Takeovers != 3 || !s.DiedAt.Equal(died) || !s.Stopping || s.HandedOver {
		t.Fatalf("after the go: %+v", s)
	}
	t.Setenv(EnvSupervisor, strconv.Itoa(os.Getppid()+1))
	if FromEnv().SupervisorAlive() {
		t.Fatal("an orphan's supervisor is alive")
	}
}
