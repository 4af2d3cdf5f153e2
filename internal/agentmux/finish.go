package agentmux

// Finisher is implemented by links that keep state per request (the
// ext_proc transport holds one gRPC stream per request): Exchange.Finish
// tells them the request is over, whether or not a CancelRequest went
// out, so that the state does not outlive it.
type Finisher interface {
	// Finished is called once per exchange, from Finish, with its request
	// id. It must not block.
	Finished(requestID uint64)
}
