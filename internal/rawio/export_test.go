package rawio

// DeadlinesGiven counts the read deadlines c handed to the poller.
func DeadlinesGiven(c *Conn) uint32 { return c.rdProgs.Load() }
