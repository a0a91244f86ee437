package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// --version, -v and the version command say the same, as any tool does.
func TestVersionFlag(t *testing.T) {
	want, _, code := gzramd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(want, "gzramd version ") || lines(want) != 1 {
		t.Fatalf("gzramd version: status %d, %q", code, want)
	}
	for _, flag := range []string{"--version", "-v"} {
		if got, stderr, code := gzramd(t, nil, flag); code != 0 || got != want {
			t.Errorf("gzramd %s: status %d, %q (stderr %q), want %q", flag, code, got, stderr, want)
		}
	}
}

// A build without -X main.version (go install, go build) reports what the
// toolchain recorded: the module version, else the commit.
func TestVersionFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		main     string
		settings map[string]string
		want     string
	}{
		{"v1.4.0", nil, "v1.4.0"},
		{"v0.0.0-20261126030000-0123456789ab", map[string]string{"vcs.revision": "ffff"}, "v0.0.0-20261126030000-0123456789ab"},
		{"(devel)", map[string]string{"vcs.revision": "0123456789abcdef0123", "vcs.modified": "false"}, "dev-0123456789ab"},
		{"(devel)", map[string]string{"vcs.revision": "0123456789abcdef0123", "vcs.modified": "true"}, "dev-0123456789ab-dirty"},
		{"(devel)", nil, "dev"},
		{"", nil, "dev"},
	} {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/gzramd/gzramd", Version: c.main}}
		for k, v := range c.settings {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: k, Value: v})
		}
		if got := versionFromBuildInfo(info); got != c.want {
			t.Errorf("version of %q %v = %q, want %q", c.main, c.settings, got, c.want)
		}
	}
}

// The README states the Go version go.mod needs, once: with
// GOTOOLCHAIN=local an older 1.26 refuses to build.
func TestReadmeStatesTheGoVersion(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("no go line in go.mod")
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	stated := regexp.MustCompile(`Go (1\.\d+(?:\.\d+)?)`).FindAllSubmatch(readme, -1)
	if len(stated) != 1 || string(stated[0][1]) != string(m[1]) {
		var vs []string
		for _, s := range stated {
			vs = append(vs, string(s[1]))
		}
		t.Errorf("README states Go %v; want Go %s, once (go.mod)", vs, m[1])
	}
}
