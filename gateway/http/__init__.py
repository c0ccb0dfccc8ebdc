"""Protocol-neutral HTTP pieces shared by every frontend (`openai/`, `kserve/`, ...): SSE framing, client
disconnects, body nesting limits. They know no protocol; the frontends sit above them and never import each other."""
