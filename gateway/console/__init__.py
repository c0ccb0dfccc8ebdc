"""The web console: a page served at / and /ui/ from files in this package (no build step, no CDN), and the two
small JSON routes it reads besides the public API (see docs/console.md)."""
