//go:build !race

package ublk

const raceEnabled = false
