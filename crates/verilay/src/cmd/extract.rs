use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
}

pub fn run(_a: Args) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
