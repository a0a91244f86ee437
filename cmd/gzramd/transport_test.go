package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/serving"
	"github.com/gzramd/gzramd/pkg/ublk"
)

func TestValidateTransport(t *testing.T) {
	for _, tc := range []struct {
		transport, device string
		swap, supervise   bool
		want              string // in the error; "" for none
	}{
		{"nbd", "", false, true, ""},
		{"auto", "", false, true, ""},
		{"auto", "/dev/nbd3", true, true, ""},
		{"ublk", "", true, false, ""},
		{"ublk", "auto", false, false, ""},
		{"UBLK", "", true, false, "want nbd, ublk or auto"},
		{"", "", true, false, "want nbd, ublk or auto"},
		{"ublk", "", false, false, "add --swap"},
		{"ublk", "/dev/nbd0", true, false, "leave --device out"},
		{"ublk", "", true, true, ""},
	} {
		c := &serving.Config{Transport: tc.transport, Device: tc.device, Swap: tc.swap, Supervise: tc.supervise}
		err := validateTransport(c)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want it valid", tc, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error saying %q", tc, err, tc.want)
		}
	}
}

// TestResolveTransport: auto takes ublk where the probe passes, supervised
// or not; an explicit ublk that the probe fails stops
// with the probe's words; nbd never probes.
func TestResolveTransport(t *testing.T) {
	noDriver := func() error { return ublk.ErrNoDriver }
	ok := func() error { return nil }
	mustNot := func() error { t.Error("probed"); return nil }
	for _, tc := range []struct {
		name      string
		cfg       serving.Config
		probe     func() error
		want, log string
		err       error
	}{
		{"nbd", serving.Config{Transport: "nbd", Swap: true}, mustNot, "nbd", "", nil},
		{"auto without a kernel device", serving.Config{Transport: "auto"}, mustNot, "nbd", "no kernel device", nil},
		{"auto supervised", serving.Config{Transport: "auto", Swap: true, Supervise: true}, ok, "ublk", "transport: ublk", nil},
		{"auto supervised without the driver", serving.Config{Transport: "auto", Swap: true, Supervise: true}, noDriver, "nbd", "modprobe ublk_drv", nil},
		{"auto without the driver", serving.Config{Transport: "auto", Swap: true}, noDriver, "nbd", "modprobe ublk_drv", nil},
		{"auto with the driver", serving.Config{Transport: "auto", Device: "auto"}, ok, "ublk", "transport: ublk", nil},
		{"auto with the driver and --swap", serving.Config{Transport: "auto", Swap: true}, ok, "ublk", "transport: ublk", nil},
		{"auto with an NBD device named", serving.Config{Transport: "auto", Device: "/dev/nbd2", Swap: true}, mustNot, "nbd", "names an NBD device", nil},
		{"ublk", serving.Config{Transport: "ublk", Swap: true}, ok, "ublk", "not the default yet", nil},
		{"ublk without the driver", serving.Config{Transport: "ublk", Swap: true}, noDriver, "", "", ublk.ErrNoDriver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			cfg := tc.cfg
			err := resolveTransport(&cfg, tc.probe, slog.New(slog.NewTextHandler(&buf, nil)))
			if !errors.Is(err, tc.err) || (err != nil && !strings.Contains(err.Error(), "--transport ublk")) {
				t.Fatalf("error %v, want %v naming --transport ublk", err, tc.err)
			}
			if err != nil {
				return
			}
			if cfg.Transport != tc.want {
				t.Errorf("transport %q, want %q", cfg.Transport, tc.want)
			}
			if !strings.Contains(buf.String(), tc.log) {
				t.Errorf("log %q, want it to say %q", buf.String(), tc.log)
			}
		})
	}
}

// TestTransportUblkWithoutDriver: --transport ublk where ublk_drv is not
// loaded stops at start, before anything serves, with one line saying to
// load it.
func TestTransportUblkWithoutDriver(t *testing.T) {
	if _, err := os.Stat(ublk.DefaultControlPath); err == nil {
		testneeds.Machine(t, "no ublk driver, and %s is here: --transport ublk would really create a device (the e2e guest-ublk scenario covers that)", ublk.DefaultControlPath)
	}
	_, stderr, code := gzramd(t, nil, "serve", "--socket", filepath.Join(t.TempDir(), "s"), "--metrics", "127.0.0.1:0",
		"--harden=false", "--supervise=false", "--swap", "--transport", "ublk")
	last := stderr[strings.LastIndex(strings.TrimSpace(stderr), "\n")+1:]
	if code != 1 || !strings.Contains(last, "--transport ublk") || !strings.Contains(last, "modprobe ublk_drv") {
		t.Errorf("--transport ublk without the driver: status %d, last line %q", code, last)
	}
	if strings.Contains(stderr, "gzramd ready") {
		t.Errorf("the daemon served before it failed:\n%s", stderr)
	}
}
