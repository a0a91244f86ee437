//go:build !race

package swapsafe

const raceEnabled = false
