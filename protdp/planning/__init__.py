"""Layout math of `protdp plan` as pure functions: parameter count, model/optimizer state bytes
(Megatron distributed-optimizer accounting), activation memory and communication volume."""
