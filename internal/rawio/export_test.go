package rawio

import "time"

// DeadlinesGiven counts the read deadlines c handed to the poller.
func DeadlinesGiven(c *Conn) uint32 { return c.rdProgs.Load() }

// QuickYields makes c's yields after a wake-up measure as instant, so
// that whether one pays depends on what its second read finds alone, not
// on how long a loaded machine kept the test's yield hook from its CPU.
// Call it before reading.
func QuickYields(c *Conn) {
	c.rmu.Lock()
	c.wySince = func(time.Time) time.Duration { return 0 }
	c.rmu.Unlock()
}
