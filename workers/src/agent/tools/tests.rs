use super::*;

#[test]
fn read_only_removes_the_writers_and_order_is_the_catalogs() {
    let asked = vec!["shell_exec".to_string(), "read_file".to_string()];
    assert_eq!(allowed(Some(&asked), false), ["read_file", "shell_exec"]);
    assert_eq!(allowed(Some(&asked), true), ["read_file"]);
    assert_eq!(allowed(None, true).len(), CATALOG.len() - WRITERS.len());
    assert!(is_known("grep") && !is_known("rm"));
}
