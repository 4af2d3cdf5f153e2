package config

import "fmt"

// BufferEstimate is the most memory the configuration lets the sidecar
// hold in message bodies and agent queues at once, the worst case of
// every body at its limit:
//
//	Total = Requests × PerRequest + SendQueues + Shadow
//
// It leaves out what does not grow with the load (the binary, the
// connection buffers) and is an estimate: a request waiting on no agent
// is not counted, one inspected by several agents only once.
type BufferEstimate struct {
	// Requests is how many requests may hold a body at once: the
	// requests that can wait on the agents that see bodies (members ×
	// conns × max_in_flight + max_queue each), at most the listeners'
	// max_connections when every listener sets it.
	Requests int64
	// PerRequest is the most body bytes one request may hold: a buffered
	// (or auto) body's limit, a streamed body's chunk_size, for the
	// request and the response, the largest of any agent on any route.
	PerRequest int64
	// SendQueues is max_pending_bytes of every uds and reverse agent's
	// connections.
	SendQueues int64
	// Shadow is shadow_queue_bytes of every shadow agent.
	Shadow int64
	// Total is the sum.
	Total int64
	// Key is the setting that bounds Requests: the max_in_flight of the
	// agent that admits the most, or the max_connections of the largest
	// listener.
	Key string
}

// held is what one message's body may hold for an agent under b.
func held(b BodyPolicy) int64 {
	switch b.Mode {
	case BodyNone:
		return 0
	case BodyStreaming:
		return int64(b.ChunkSize)
	}
	// buffered, and auto (buffered unless the agent streams)
	return int64(b.Limit)
}

// BufferEstimate computes the worst case of a validated configuration.
func (c *Config) BufferEstimate() BufferEstimate {
	var e BufferEstimate
	perAgent := make(map[string]int64) // agent → most bytes per request
	for i := range c.Routes {
		for j := range c.Routes[i].Agents {
			ra := &c.Routes[i].Agents[j]
			if c.Agent(ra.Name) == nil {
				continue
			}
			p := c.Policy(ra)
			perAgent[ra.Name] = max(perAgent[ra.Name], held(p.RequestBody)+held(p.ResponseBody))
		}
	}
	var most int64
	for i := range c.Agents {
		a := &c.Agents[i]
		members := int64(len(a.Members()))
		if a.Transport == TransportUDS || a.Transport == TransportReverse {
			e.SendQueues += members * int64(a.Conns) * int64(a.MaxPendingBytes)
		}
		b, onRoute := perAgent[a.Name]
		if !onRoute {
			continue
		}
		if a.Shadow {
			e.Shadow += int64(a.ShadowQueueBytes)
			continue
		}
		if b == 0 {
			continue
		}
		r := members*int64(a.Conns)*int64(a.MaxInFlight) + int64(a.MaxQueue)
		e.Requests += r
		e.PerRequest = max(e.PerRequest, b)
		if r*b > most {
			most, e.Key = r*b, fmt.Sprintf("agents[%d].max_in_flight", i)
		}
	}
	var conns int64
	largest := -1
	for i := range c.Listeners {
		n := c.Listeners[i].MaxConnections
		if n == 0 {
			largest = -1
			conns = 0
			break
		}
		conns += int64(n)
		if largest < 0 || n > c.Listeners[largest].MaxConnections {
			largest = i
		}
	}
	if largest >= 0 && conns < e.Requests {
		e.Requests = conns
		e.Key = fmt.Sprintf("listeners[%d].max_connections", largest)
	}
	e.Total = e.Requests*e.PerRequest + e.SendQueues + e.Shadow
	return e
}
