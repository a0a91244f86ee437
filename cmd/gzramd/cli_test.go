package main

import (
	"strings"
	"testing"
)

func TestBadFlagsFailWithOneLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		flag string // the line must name this
	}{
		{"size unit", nil, []string{"--size", "12parsecs"}, "--size"},
		{"size not pages", nil, []string{"--size", "4097"}, "--size"},
		{"size zero", nil, []string{"--size", "0"}, "--size"},
		{"mem-limit", nil, []string{"--mem-limit", "-1GiB"}, "--mem-limit"},
		{"backend", nil, []string{"--backend", "tpu"}, "--backend"},
		{"algorithm", nil, []string{"--algorithm", "gzip"}, "--algorithm"},
		{"batch-pages", nil, []string{"--batch-pages", "0"}, "--batch-pages"},
		{"batch-deadline", nil, []string{"--batch-deadline", "2s"}, "--batch-deadline"},
		{"batch-deadline syntax", nil, []string{"--batch-deadline", "soon"}, "--batch-deadline"},
		{"tcp", nil, []string{"--tcp", "localhost"}, "--tcp"},
		{"metrics", nil, []string{"--metrics", "9829"}, "--metrics"},
		{"log-level", nil, []string{"--log-level", "loud"}, "--log-level"},
		{"device", nil, []string{"--device", "/dev/sda"}, "--device"},
		{"swap-priority", nil, []string{"--swap-priority", "-7"}, "--swap-priority"},
		{"kernel-timeout", nil, []string{"--kernel-timeout", "1500ms"}, "--kernel-timeout"},
		{"go-memory-limit", nil, []string{"--go-memory-limit", "1MiB"}, "--go-memory-limit"},
		{"nbd-inline", nil, []string{"--nbd-inline", "maybe"}, "--nbd-inline"},
		{"realtime", nil, []string{"--realtime", "yes"}, "--realtime"},
		{"nbd-inline-helpers", nil, []string{"--nbd-inline-helpers", "17"}, "--nbd-inline-helpers"},
		{"record-trace directory", nil, []string{"--record-trace", "/"}, "--record-trace"},
		{"record-trace missing directory", nil, []string{"--record-trace", "/nonexistent/gzramd/trace"}, "--record-trace"},
		{"object-pages", nil, []string{"--object-pages", "3"}, "--object-pages"},
		{"transport", nil, []string{"--transport", "virtio"}, "--transport"},
		{"ublk-depth", nil, []string{"--ublk-depth", "0"}, "--ublk-depth"},
		{"ublk-depth too deep", nil, []string{"--ublk-depth", "4097"}, "--ublk-depth"},
		{"transport ublk without a device", nil, []string{"--transport", "ublk", "--supervise=false"}, "--transport"},
		{"transport ublk with an nbd device", nil, []string{"--transport", "ublk", "--supervise=false", "--device", "/dev/nbd0"}, "--device"},
		{"unknown flag", nil, []string{"--sise", "1GiB"}, "--sise"},
		{"env size", []string{"GZRAMD_SIZE=lots"}, nil, "GZRAMD_SIZE"},
		{"env bool", []string{"GZRAMD_SWAP=maybe"}, nil, "GZRAMD_SWAP"},
		{"env validated", []string{"GZRAMD_BACKEND=fpga"}, nil, "--backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--socket", t.TempDir() + "/s", "--metrics", "127.0.0.1:0", "--harden=false"}, tc.args...)
			stdout, stderr, code := gzramd(t, tc.env, args...)
			if code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout not empty: %q", stdout)
			}
			if lines(stderr) != 1 || !strings.HasPrefix(stderr, "gzramd: ") || !strings.Contains(stderr, tc.flag) {
				t.Errorf("stderr should be one line naming %s, got:\n%s", tc.flag, stderr)
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	_, stderr, code := gzramd(t, nil, "srve")
	if code != 2 || !strings.Contains(stderr, "unknown command") {
		t.Errorf("gzramd srve: status %d, stderr %q; want 2 and \"unknown command\"", code, stderr)
	}
}

func TestHelpTeaches(t *testing.T) {
	out, _, code := gzramd(t, nil, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit status %d", code)
	}
	for _, want := range []string{
		"GZRAMD_", "--size", "--socket", "--metrics", "--swap", "--device", "--force",
		"nbd-client", "vm.min_free_kbytes", "Examples:", "--mem-limit",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help does not mention %s", want)
		}
	}
	out, _, code = gzramd(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit status %d", code)
	}
	for _, sub := range []string{"serve", "status", "bench", "version"} {
		if !strings.Contains(out, "  "+sub) {
			t.Errorf("gzramd --help does not list the %s command", sub)
		}
	}
	out, _, code = gzramd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "gzramd ") {
		t.Errorf("version: status %d, output %q", code, out)
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	d := startDaemon(t, []string{"GZRAMD_SIZE=24MiB", "GZRAMD_EXPORT=envdev", "GZRAMD_ALGORITHM=zstd", "GZRAMD_HARDEN=false"},
		"--algorithm", "lz4") // the command line wins over GZRAMD_ALGORITHM
	f := d.scrape()
	if v, _ := f.Value("gzramd_disksize_bytes"); v != 24<<20 {
		t.Errorf("GZRAMD_SIZE=24MiB gave a %v-byte device", v)
	}
	if got := f.Label("gzramd_info", "export"); got != "envdev" {
		t.Errorf("GZRAMD_EXPORT=envdev gave export %q", got)
	}
	if got := f.Label("gzramd_info", "algorithm"); got != "lz4" {
		t.Errorf("--algorithm lz4 with GZRAMD_ALGORITHM=zstd gave %q; the command line must win", got)
	}
	if !strings.Contains(d.log.String(), "hardening off") {
		t.Error("GZRAMD_HARDEN=false did not turn hardening off")
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
}
