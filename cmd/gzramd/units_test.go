package main

import (
	"testing"

	"github.com/gzramd/gzramd/pkg/serving"
)

func TestParseDevice(t *testing.T) {
	for in, want := range map[string]int{"/dev/nbd0": 0, "nbd15": 15, "auto": -1} {
		if got, err := serving.ParseDevice(in); err != nil || got != want {
			t.Errorf("serving.ParseDevice(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"/dev/sda", "/dev/nbd", "/dev/nbd-1", "/dev/nbd01", "nbd1x", ""} {
		if _, err := serving.ParseDevice(in); err == nil {
			t.Errorf("serving.ParseDevice(%q) accepted", in)
		}
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "8GiB": 8 << 30, "1.5G": 3 << 29, "512 MiB": 512 << 20, "1GB": 1e9, "2k": 2048} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1G", "G", "1 parsec", "1e30TiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 4096: "4K", 1536: "1.5K", 64 << 20: "64M", 3 << 30: "3G"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
