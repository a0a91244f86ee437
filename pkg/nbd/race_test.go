//go:build race

package nbd

// raceEnabled: the race detector's shadow memory grows with the heap and
// is never given back, so resident memory says nothing of what the
// server gives back.
const raceEnabled = true
