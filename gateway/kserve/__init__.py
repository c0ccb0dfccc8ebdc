"""KServe v2 (Triton) protocol: wire codecs and, later, the HTTP and gRPC front ends."""
