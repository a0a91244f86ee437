// The --device flag's value, and how long stopping may take to turn swap off.

package main

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// parseDevice accepts /dev/nbdN, nbdN or "auto" (any free device).
func parseDevice(s string) (index int, err error) {
	if s == "auto" {
		return -1, nil
	}
	n, ok := strings.CutPrefix(strings.TrimPrefix(s, "/dev/"), "nbd")
	if ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 0 && strconv.Itoa(i) == n {
			return i, nil
		}
	}
	return 0, errors.New("want /dev/nbdN (e.g. /dev/nbd0) or auto")
}

// swapoffTimeout bounds swapoff at stop; it can take minutes when much
// is swapped out, and systemd's TimeoutStopSec must be longer.
const swapoffTimeout = 30 * time.Minute
