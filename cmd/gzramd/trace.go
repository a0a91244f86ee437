// Checks for --record-trace.

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// checkCreatable reports why path could not be created or replaced, by
// trying: the permission bits alone miss read-only file systems and the
// like. It leaves an existing file as it was, and no new one behind.
func checkCreatable(path string) error {
	fi, err := os.Stat(path)
	if err == nil && fi.IsDir() {
		return errors.New("a directory is there")
	}
	existed := err == nil
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("cannot create it: %w", err)
	}
	f.Close()
	if !existed {
		os.Remove(path)
	}
	return nil
}
