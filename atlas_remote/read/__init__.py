"""Reading: `AtlasDataset` (`reader`) over finding a dataset (`discovery`), the shard table (`shards`,
`shard_fetch`), the block loader and its caches (`blocks`, `cache`, `cache_folder`), read-ahead (`readahead`),
the reader's settings (`options`), and taking data out (`export`, `description`). Knows nothing of writing;
see docs/architecture.md."""
