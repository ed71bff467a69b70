"""What the tools run on, knowing no API, in three rooms: search/ (search backends behind one protocol, SearXNG the
first), pages/ (the page fetcher with its SSRF guard, body decoding and extraction) and state/ (the TTL cache and the
stores under what outlives a request: in process, or Valkey/Redis with STATE_URL; the keys file; the team's usage and
queue). A room imports its own modules and those of the rooms after it in that order, never one before it."""
