//! The shell completions and the manual page, generated from the clap definitions, so that
//! they never disagree with `--help`.

use std::io::Write;

use anyhow::Context;

use crate::cli;

/// Write the completion script of `shell` for the program as it was called (`reloader`, or
/// `kubectl-reloader` as a kubectl plugin).
pub fn completions(shell: clap_complete::Shell, out: &mut impl Write) -> anyhow::Result<()> {
    let mut command = cli::command();
    let name = cli::called_as().unwrap_or_else(|| command.get_name().to_string());
    // Into memory first: clap_complete panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut script);
    write_all(out, &script).context("cannot write the completion script")
}

/// Write the manual page, section 1, in roff.
pub fn man_page(out: &mut impl Write) -> anyhow::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cli::command()).render(&mut page).context("cannot render the manual page")?;
    write_all(out, &page).context("cannot write the manual page")
}

/// A reader that went away (`reloader man | head`) is not an error.
fn write_all(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
