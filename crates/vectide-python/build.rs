//! Records the commit the extension is built at (`vectide.build_commit()`),
//! so that results name the code that made them even when the run's
//! working directory is not the repository. `unknown` outside a git
//! checkout (a source archive).

use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=VECTIDE_BUILD_COMMIT={commit}");
    // A new commit (or a checkout) builds again; the files of the git
    // directory are found through git itself (a worktree keeps them apart).
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).filter(|b| b != "HEAD");
    for path in ["HEAD", "index", "packed-refs"]
        .into_iter()
        .map(String::from)
        .chain(branch)
    {
        if let Some(p) = git(&["rev-parse", "--git-path", &path]) {
            println!("cargo:rerun-if-changed={}", root.join(p).display());
        }
    }
}
