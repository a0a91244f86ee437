//go:build race

package pagestore

// raceEnabled: the race detector's shadow memory is written as code first
// touches memory (the store's arenas too), so a thread's page faults say
// nothing of the store's.
const raceEnabled = true
