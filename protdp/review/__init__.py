"""Human review of gated predictions: the queue store (`store`), the reviewer CLI (`cli`,
`protdp review ...`) and the server-rendered web UI (`web`, `protdp review serve`)."""
