"""Writing: `AtlasDatasetWriter` (`writer`), `write` and `build` (`build`), `convert`, `copy_dataset` (`copy`) and
`verify`/`checksum`/`index` (`verify`), all through one pipeline (`settings`, `shard_writer`, `part_writer`,
`parts`, `pipeline`) that stages parts under a lease (`lease`) and commits them once (`commit`); Ray Data's
source and sink (`ray_data`, `ray_tasks`). See docs/architecture.md."""
