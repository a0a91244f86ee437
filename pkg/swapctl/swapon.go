// Turning swap on and off with util-linux's tools.

package swapctl

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// runTool runs an administration tool and folds its output into the error.
func runTool(ctx context.Context, name string, args ...string) error {
	path, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("%s not found (Debian package util-linux): %w", name, err)
	}
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// Enable formats dev as swap and turns it on with discard, so that
// freed swap slots reach the daemon as trims and their memory is given
// back.
func Enable(ctx context.Context, dev string, priority int) error {
	if err := runTool(ctx, "mkswap", "--label", "gzramd", dev); err != nil {
		return err
	}
	args := []string{"--discard"}
	if priority >= 0 {
		args = append(args, "--priority", strconv.Itoa(priority))
	}
	return runTool(ctx, "swapon", append(args, dev)...)
}

// Disable turns swap on dev off; the kernel reads every page back
// first, so this takes as long as reading the swapped data.
func Disable(ctx context.Context, dev string) error {
	return runTool(ctx, "swapoff", dev)
}
