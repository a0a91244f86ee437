//go:build race

package ublk

// raceEnabled: the race detector's shadow memory is written as code first
// touches memory, so a thread's page faults say nothing of the backend's.
const raceEnabled = true
