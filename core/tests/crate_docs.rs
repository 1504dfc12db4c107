//! The crate docs list every public module with its purpose, so that a
//! reader of the docs.rs front page sees the whole crate: a module added
//! without a line there fails here.

/// The names of the `pub mod` items of the crate root.
fn public_modules(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub mod ")?;
            let name = rest.split([';', ' ', '{']).next()?;
            Some(name.to_owned())
        })
        .collect()
}

/// The crate docs: the leading `//!` lines.
fn crate_docs(source: &str) -> String {
    source
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .map(|line| line.trim_start_matches("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the docs' module list has a line for `name` that says what it
/// holds: `- [`name`]: …` (or `- `name`` for a module behind a feature).
fn listed(docs: &str, name: &str) -> bool {
    let linked = format!("- [`{name}`]: ");
    let plain = format!("- `{name}` ");
    docs.lines().any(|line| {
        let line = line.trim_start();
        (line.starts_with(&linked) && line.len() > linked.len() + 10) || line.starts_with(&plain)
    })
}

#[test]
fn every_public_module_has_a_line_in_the_crate_docs() {
    let source = include_str!("../src/lib.rs");
    let modules = public_modules(source);
    assert!(
        modules.len() >= 15,
        "the crate root's modules were not found: {modules:?}"
    );
    let docs = crate_docs(source);
    let missing: Vec<&String> = modules.iter().filter(|m| !listed(&docs, m)).collect();
    assert!(
        missing.is_empty(),
        "public modules without a line in the crate docs of src/lib.rs: {missing:?}"
    );
}

#[test]
fn a_module_without_its_line_is_found() {
    let source =
        "//! Modules:\n//!\n//! - [`a`]: the first one, described.\n\npub mod a;\npub mod b;\n";
    let docs = crate_docs(source);
    let missing: Vec<String> = public_modules(source)
        .into_iter()
        .filter(|m| !listed(&docs, m))
        .collect();
    assert_eq!(missing, ["b"]);
}
