package httpauth

import (
	"fmt"
	"time"
)

// dialErr classifies a dial that failed at now for a subrequest due by
// deadline. One that ran into the subrequest's own deadline is its
// timeout; one cut short by DialTimeout while the subrequest still had
// time (the service did not accept the connection in time) is a failure
// to connect, as a refused connection is: with addresses, the request
// goes on to another member (agentmux.Retryable) instead of meeting the
// failure policy with time left.
func (c *Client) dialErr(err error, now, deadline time.Time) error {
	if !deadline.IsZero() && !now.Add(c.cfg.DialTimeout).Before(deadline) {
		return timeoutErr(err)
	}
	return fmt.Errorf("connect: %v", err)
}
