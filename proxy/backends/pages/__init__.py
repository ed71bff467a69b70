"""Pages: one URL read into text for web_fetch, find_in_page and Codex's alpha search: the SSRF guard and the domain
filters (netguard), the fetcher, body to text (pagetext), the extraction pool whose children pick the main content
(readable) and write it as Markdown (markdown) or read a PDF's text (pdftext), and what a person does not see taken
out (invisible).

Its protocol is fetcher.PageFetcher (`fetch(url, max_tokens, allowed_domains, blocked_domains, cancel)` giving a
Page or raising FetchError, and `scoped(scope)`); Fetcher is the one, and the tools hold it only by that type."""
