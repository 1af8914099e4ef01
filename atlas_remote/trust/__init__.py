"""Trust: what a stranger's bytes may become. The signing key that marks a block as the user's own (`keys`),
the restricted unpickler and the globals it allows (`unpickler`, `safe_builtins`, `safe_arrays`), the symbolic
walk of a block's opcodes before anything is built (`walk`, `walk_opcodes`, `walk_graph`, `walk_keys`), and the
measure of what decoded values hold (`measure`). Imports nothing of the package but `errors`; see
docs/security.md."""
