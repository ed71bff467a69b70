"""Search: what a search is and gives (Hit, SearchOutcome), SearXNG, the opt-in Brave Search API, the failover over
several instances with its memory of failing instances and engines (search_health), and the search cache.

Its protocol is search.SearchBackend (`results`, `timeout`, `search(query, language, limit, time_range, cancel)`,
never raising: every failure an outcome); SearXNG, BraveSearch, FailoverSearch and CachedSearch are each one, and
the rest of the proxy holds a search backend only by that type."""
