// What every command shares: the version, exit statuses for usage
// errors, and flags from the environment.

package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// version is set at build time with -ldflags "-X main.version=..." (make
// build sets git describe's); buildVersion falls back to what the Go
// toolchain recorded.
var version string

// buildVersion is the version gzramd reports: -X main.version's, else the
// module version go install recorded (v1.2.3, or a pseudo-version for a
// commit), else the commit a build from a checkout recorded, else "dev".
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	return versionFromBuildInfo(info)
}

func versionFromBuildInfo(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	v := "dev-" + rev[:min(len(rev), 12)]
	if modified == "true" {
		v += "-dirty"
	}
	return v
}

// usageError is a bad command line or configuration: exit status 2, as
// for any command-line tool, so that systemd and scripts can tell it from a
// failure at run time (status 1).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usageErr(err error) error { return usageError{err} }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") {
		return 2
	}
	return 1
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "gzramd version", buildVersion())
		},
	}
}

// bindEnv lets every flag of fs be set from GZRAMD_<FLAG> (upper case,
// dashes as underscores); a flag given on the command line wins.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "GZRAMD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("invalid value %q for %s (from the environment): %w", v, name, e)
			}
		}
	})
	return err
}
