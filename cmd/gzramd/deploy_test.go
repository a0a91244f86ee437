package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"

	"github.com/gzramd/gzramd/pkg/serving"
)

const unitDir = "../../deploy/systemd"

// TestSystemdUnitsVerify runs systemd-analyze verify on every unit, with
// ExecStart pointed at the binary under test (verify checks it exists).
// Any complaint fails the test, not only the exit status.
func TestSystemdUnitsVerify(t *testing.T) {
	path := testneeds.Command(t, "systemd-analyze", "systemd")
	units, _ := filepath.Glob(filepath.Join(unitDir, "*.service"))
	if len(units) == 0 {
		t.Fatal("no units in " + unitDir)
	}
	dir := t.TempDir()
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "/usr/local/bin/gzramd", gzramdBin)
		dst := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(dst, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		// --man=no: the man pages in Documentation= come with packages
		// (nbd-client) the unit does not need, and may not be installed.
		out, err := exec.Command(path, "verify", "--man=no", dst).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(u), err, out)
		}
	}
}

// TestUnitPromises checks the settings the swap use depends on, which
// systemd-analyze cannot judge.
func TestUnitPromises(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(unitDir, "gzramd.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, want := range []string{
		"Type=notify", "WatchdogSec=", "LimitMEMLOCK=infinity", "OOMScoreAdjust=-1000",
		"SendSIGKILL=no", "RuntimeDirectory=gzramd", "EnvironmentFile=-/etc/gzramd/gzramd.env",
		"CapabilityBoundingSet=CAP_IPC_LOCK CAP_SYS_RESOURCE CAP_SYS_NICE CAP_SYS_ADMIN\n", "RestrictRealtime=no\n", "TimeoutStopSec=30min",
		// After a missed watchdog ping systemd waits TimeoutAbortSec, then
		// sends SIGTERM: gzramd would turn swap off (test/e2e/systemd.sh).
		"WatchdogSignal=SIGUSR1\n", "TimeoutAbortSec=infinity\n",
		"ExecStart=/usr/local/bin/gzramd serve\n",
		// Crash survival (README "Surviving a crash"): the serving process,
		// a child, notifies; the state outlives the supervisor in the
		// file descriptor store, kept across Restart= and never dropped by
		// the start rate limit.
		"NotifyAccess=all\n", "FileDescriptorStoreMax=16\n", "Restart=always\n", "StartLimitIntervalSec=0\n",
		"RuntimeDirectoryPreserve=restart\n", "KillMode=process\n",
		// The supervisor's Keeper locks the state's pages only after a
		// serving process died; until then they must not go to swap.
		"MemorySwapMax=0\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("gzramd.service lacks %q", want)
		}
	}
	// A private /tmp cannot be set up again while the serving process of a
	// dead supervisor still serves in the unit: the restart fails (EBUSY).
	if strings.Contains(unit, "\nPrivateTmp=yes") {
		t.Error("gzramd.service sets PrivateTmp=yes")
	}
}

// TestUnitLeavesDevicesOpen: gzramd opens /dev/nbdN (its self-test, then
// mkswap and swapon) and the GPU's /dev/nvidia*, so the unit must not
// restrict device access. ProtectClock=yes did so before systemd 253: it
// implied DeviceAllow=char-rtc r, which closes every other device, and
// under Debian 11's systemd 247 the unit failed at start with "open
// /dev/nbd0: operation not permitted" (test/e2e/systemd.sh). The clock is
// protected by the capability bounding set and a system call filter
// instead.
func TestUnitLeavesDevicesOpen(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(unitDir, "gzramd.service"))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			settings[k] = strings.TrimSpace(v)
		}
	}
	for k, v := range settings {
		switch k {
		case "DeviceAllow":
			t.Errorf("gzramd.service sets DeviceAllow=%s: any allow list closes /dev/nbdN and /dev/nvidia*", v)
		case "DevicePolicy":
			if v != "auto" {
				t.Errorf("gzramd.service sets DevicePolicy=%s: /dev/nbdN and /dev/nvidia* must stay open", v)
			}
		case "PrivateDevices", "ProtectClock":
			if v != "no" && v != "false" && v != "0" && v != "off" {
				t.Errorf("gzramd.service sets %s=%s, which closes /dev/nbdN (and /dev/nvidia*)", k, v)
			}
		}
	}
	if caps := settings["CapabilityBoundingSet"]; strings.Contains(caps, "CAP_SYS_TIME") || strings.Contains(caps, "CAP_WAKE_ALARM") {
		t.Errorf("CapabilityBoundingSet=%s lets gzramd set the clock", caps)
	}
	if settings["SystemCallFilter"] != "~@clock" || settings["SystemCallErrorNumber"] != "EPERM" {
		t.Errorf("gzramd.service must filter @clock with EPERM (not a SIGSYS that kills the swap daemon): SystemCallFilter=%q SystemCallErrorNumber=%q",
			settings["SystemCallFilter"], settings["SystemCallErrorNumber"])
	}
}

// TestEnvFileNamesRealFlags makes sure every GZRAMD_ setting in the env
// file is a flag of gzramd serve (a typo would be silently ignored), and
// that the values parse and validate.
func TestEnvFileNamesRealFlags(t *testing.T) {
	f, err := os.Open(filepath.Join(unitDir, "gzramd.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg := serving.Config{Size: 1 << 30, GoMemoryLimit: 512 << 20}
	cmd := serveCmd(&cfg)
	extra := map[string]bool{"GZRAMD_MIN_FREE_KBYTES": true} // read by the unit's ExecStartPre
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "GZRAMD_") {
			t.Errorf("gzramd.env: %q is not a GZRAMD_ setting", line)
			continue
		}
		if extra[k] {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "GZRAMD_"), "_", "-"))
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("gzramd.env: %s names no flag (--%s)", k, name)
			continue
		}
		if err := cmd.Flags().Set(name, v); err != nil {
			t.Errorf("gzramd.env: %s=%s: %v", k, v, err)
		}
		n++
	}
	if n < 5 {
		t.Errorf("only %d settings in gzramd.env", n)
	}
	if err := validate(&cfg); err != nil {
		t.Errorf("gzramd.env does not validate: %v", err)
	}
}
