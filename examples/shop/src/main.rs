//! The `shop` binary: the example service (`shop --help` lists its flags).

/// mimalloc: the command path allocates many small short-lived buffers; measured faster
/// than the system allocator (`benches/commands.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    shop::service::app().run()
}
