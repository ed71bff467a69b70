"""State: what outlives a request. The store under the caches, Codex's ref ids and the cool-downs (state: the State
protocol, MemoryState or RedisState with STATE_URL), the one cache mechanism on it (cache: TTLCache with its
SharedTier), the people's keys file (keys), and the team's usage, quotas, requests in flight and queue tickets
(teamstore in SQLite, teamstore_redis with STATE_URL).

Its protocols are state.State (values, counters and small maps, each under a use and a key with a TTL) and
teamstore.TeamStorage (admit, ended, usage, enqueue, admitted, release, queue_view), which TeamStore and
RedisTeamStore both keep, so that the key check and the fair queue never know which they hold."""
