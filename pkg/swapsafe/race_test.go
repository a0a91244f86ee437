//go:build race

package swapsafe

// raceEnabled: the race detector keeps state of its own for each
// goroutine and thread, made as they first need it, so a thread's page
// faults say nothing of the runtime's.
const raceEnabled = true
