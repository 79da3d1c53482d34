//! Man pages and shell completions generated from a binary's own clap definition, so they
//! never drift from `--help`: `scripts/build-deb.sh` asks each packaged binary for them.
//!
//! Each binary's `main` calls [`run_if_asked`] first. Its first argument then picks:
//!
//! ```text
//! BIN --generate-man DIR                  DIR/BIN.SECTION, and a page per subcommand
//!                                         (DIR/dog-vdi-create.8, ...)
//! BIN --generate-completions SHELL DIR    bash: DIR/BIN, zsh: DIR/_BIN, fish: DIR/BIN.fish
//!                                         (also elvish, powershell)
//! ```
//!
//! These options are hidden: they are not in the clap definition (so no `--help` lists them
//! and no required argument such as `sheep --dir` is asked for), and they count only as the
//! first argument, so they never clash with a binary's own options.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::Command;
use clap_complete::Shell;

/// The hidden option that asks for man pages.
pub const MAN: &str = "--generate-man";
/// The hidden option that asks for completions.
pub const COMPLETIONS: &str = "--generate-completions";

/// What went wrong while generating: always names the argument or file at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The arguments after the hidden option are not what it takes.
    #[error("{0}")]
    Usage(String),
    /// Writing a generated file failed.
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// If this process's first argument is [`MAN`] or [`COMPLETIONS`], writes what it asks for
/// from `command()` under the command name `name` (the installed binary's: a derived
/// command is named after its crate), man pages in `section`, prints the files written and
/// exits: status 0, or 2 with the error on stderr. Otherwise returns and the binary goes on.
pub fn run_if_asked(name: &'static str, section: &str, command: fn() -> Command) {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match generate(&args, name, section, command) {
        Ok(None) => {}
        Ok(Some(files)) => {
            let mut out = std::io::stdout().lock();
            for f in files {
                let _ = writeln!(out, "{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            let mut msg = format!("{name}: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            std::process::exit(2);
        }
    }
}

/// The testable core of [`run_if_asked`]: `Ok(None)` when `args` (without the program name)
/// ask for nothing, else the files written.
pub fn generate(
    args: &[OsString],
    name: &'static str,
    section: &str,
    command: fn() -> Command,
) -> Result<Option<Vec<PathBuf>>, Error> {
    let Some(first) = args.first().and_then(|a| a.to_str()) else {
        return Ok(None);
    };
    let command = || command().name(name).bin_name(name).display_name(name);
    match first {
        MAN => {
            let [_, dir] = args else {
                return Err(Error::Usage(format!("usage: {MAN} DIR")));
            };
            man_pages(command(), section, Path::new(dir)).map(Some)
        }
        COMPLETIONS => {
            let [_, shell, dir] = args else {
                return Err(Error::Usage(format!(
                    "usage: {COMPLETIONS} SHELL DIR (SHELL: bash, zsh, fish, elvish, powershell)"
                )));
            };
            let shell = shell
                .to_str()
                .and_then(|s| Shell::from_str(s).ok())
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "{COMPLETIONS}: unknown shell '{}': expected bash, zsh, fish, elvish or powershell",
                        shell.to_string_lossy()
                    ))
                })?;
            completions(command(), shell, Path::new(dir)).map(|f| Some(vec![f]))
        }
        _ => Ok(None),
    }
}

fn create(path: &Path) -> Result<BufWriter<File>, Error> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })
}

fn finish(path: &Path, w: BufWriter<File>) -> Result<(), Error> {
    w.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// Writes the man page of `cmd` and of each of its visible subcommands, at any depth, into
/// `dir` (which must exist): `NAME.SECTION`, `NAME-SUB.SECTION`, ...
pub fn man_pages(cmd: Command, section: &str, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    // `build` names each subcommand after its parents (`dog-vdi-create`), the pages' names.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    let mut todo = vec![cmd];
    while let Some(cmd) = todo.pop() {
        todo.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let man = clap_mangen::Man::new(cmd).section(section);
        let path = dir.join(man.get_filename());
        let mut w = create(&path)?;
        man.render(&mut w).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        finish(&path, w)?;
        out.push(path);
    }
    Ok(out)
}

/// The file a completion script for `name` goes in, as each shell's loader looks for it
/// (bash-completion loads `completions/NAME` when NAME is first completed).
pub fn completion_file(shell: Shell, name: &str) -> String {
    use clap_complete::Generator;
    match shell {
        Shell::Bash => name.to_owned(),
        other => other.file_name(name),
    }
}

/// Writes the completion script of `cmd` for `shell` into `dir` (which must exist).
pub fn completions(mut cmd: Command, shell: Shell, dir: &Path) -> Result<PathBuf, Error> {
    let name = cmd.get_name().to_owned();
    let path = dir.join(completion_file(shell, &name));
    let mut w = create(&path)?;
    clap_complete::generate(shell, &mut cmd, name, &mut w);
    finish(&path, w)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn cli() -> Command {
        Command::new("crate-name")
            .about("A tool.")
            .arg(Arg::new("dir").long("dir").required(true))
            .subcommand(Command::new("vdi").subcommand(Command::new("create").about("Create.")))
            .subcommand(Command::new("secret").hide(true))
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn other_arguments_ask_for_nothing() {
        assert!(generate(&os(&[]), "tool", "8", cli).unwrap().is_none());
        assert!(generate(&os(&["--dir", "x"]), "tool", "8", cli)
            .unwrap()
            .is_none());
    }

    #[test]
    fn man_pages_for_every_visible_command() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_str().unwrap();
        let mut names: Vec<String> = generate(&os(&[MAN, dir]), "tool", "8", cli)
            .unwrap()
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["tool-vdi-create.8", "tool-vdi.8", "tool.8"]);
        let page = std::fs::read_to_string(d.path().join("tool.8")).unwrap();
        assert!(page.starts_with(".ie"), "{page}");
        assert!(page.contains(".TH tool 8"), "{page}");
        assert!(page.contains("\\-\\-dir"), "{page}");
    }

    #[test]
    fn completions_named_for_each_loader() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_str().unwrap();
        for (shell, file, dir_option) in [
            ("bash", "tool", "--dir"),
            ("zsh", "_tool", "--dir"),
            ("fish", "tool.fish", "-l dir"),
        ] {
            let got = generate(&os(&[COMPLETIONS, shell, dir]), "tool", "8", cli)
                .unwrap()
                .unwrap();
            assert_eq!(got, [d.path().join(file)]);
            let text = std::fs::read_to_string(&got[0]).unwrap();
            assert!(text.contains(dir_option), "{shell}: {text}");
            assert!(
                !text.contains("crate-name"),
                "{shell}: named after the binary"
            );
        }
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let e = generate(&os(&[MAN]), "tool", "8", cli)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--generate-man DIR"), "{e}");
        let e = generate(&os(&[COMPLETIONS, "tcsh", "/tmp"]), "tool", "8", cli)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown shell 'tcsh'"), "{e}");
        let e = generate(&os(&[MAN, "/nonexistent/dir"]), "tool", "8", cli).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dir/tool.8"), "{e}");
    }
}
