//! `ferry serve`'s data dir holds the callback secret, the toolsets (with
//! the credentials in their URLs) and every call's arguments and results:
//! a new one is created owner-only, and so is everything Ferry writes in
//! it; an existing one open to others is warned about and left as it is.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_tests::{Ferry, FerryOptions};
use serde_json::json;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every path beneath `dir` (not `dir` itself), depth first.
fn beneath(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(beneath(&path));
        }
        out.push(path);
    }
    out
}

/// The paths beneath `dir` that group or others may read, write or enter,
/// with their modes.
fn open_to_others(dir: &Path) -> Vec<String> {
    beneath(dir)
        .iter()
        .filter(|p| mode(p) & 0o077 != 0)
        .map(|p| format!("{} {:04o}", p.display(), mode(p)))
        .collect()
}

async fn one_call(ferry: &Ferry) {
    let api = ferry.api();
    let call = json!({"operation": "echo", "arguments": {"text": "a secret"},
                      "group_id": "g", "id": "c"});
    let (status, reply) = api.submit(call).await;
    assert_eq!(status, 202, "{reply}");
    api.wait_for("g", "c", "tool_result").await;
}

#[tokio::test]
async fn a_new_data_dir_and_everything_in_it_are_owner_only() {
    let root = tempfile::tempdir().unwrap();
    // Two levels that are not there yet: the parent Ferry creates on the
    // way is as private as the dir itself.
    let data = root.path().join("new").join("data");
    let mut ferry = Ferry::start(FerryOptions {
        data: Some(data.clone()),
        ..FerryOptions::demo_with(&[])
    })
    .await;
    one_call(&ferry).await;
    // Stopped the way an operator stops it, so that what it writes on the
    // way out (sled's last flush) is checked too.
    let status = ferry.terminate(Duration::from_secs(30)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    assert_eq!(mode(&root.path().join("new")), 0o700);
    assert_eq!(mode(&data), 0o700);
    let files = beneath(&data);
    // The secret, the demo tool's port, and sled's files at least: a walk
    // that found nothing would prove nothing.
    assert!(files.len() >= 3, "{files:#?}");
    assert!(
        files.iter().any(|p| p.ends_with("sled")),
        "no store in {files:#?}"
    );
    let open = open_to_others(&data);
    assert!(open.is_empty(), "open to group or others: {open:#?}");
}

#[tokio::test]
async fn an_existing_data_dir_open_to_others_is_warned_about_and_left_as_it_is() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = root.path().join("ferry.log");
    let ferry = Ferry::start(FerryOptions {
        data: Some(data.clone()),
        log: Some(log.clone()),
        ..FerryOptions::demo_with(&[])
    })
    .await;
    one_call(&ferry).await;

    // The warning comes before Ferry listens, and the log is written
    // unbuffered to a file: it is there by now.
    let text = std::fs::read_to_string(&log).unwrap();
    let warning = text
        .lines()
        .find(|l| l.contains("the data dir is open to other users"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{text}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("chmod 700"), "{warning}");
    assert!(warning.contains(&data.display().to_string()), "{warning}");
    assert!(warning.contains("0755"), "{warning}");
    // Its owner chose the mode, or must be told: Ferry does not change it,
    // and what Ferry writes in it is still its owner's alone.
    assert_eq!(mode(&data), 0o755);
    let open = open_to_others(&data);
    assert!(open.is_empty(), "open to group or others: {open:#?}");
}

#[tokio::test]
async fn an_owner_only_data_dir_is_not_warned_about() {
    let root = tempfile::tempdir().unwrap();
    let log = root.path().join("ferry.log");
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let ferry = Ferry::start(FerryOptions {
        data: Some(data),
        log: Some(log.clone()),
        ..FerryOptions::demo_with(&[])
    })
    .await;
    one_call(&ferry).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("toolsets loaded"),
        "the log is empty, so its silence proves nothing:\n{text}"
    );
    assert!(
        !text.contains("the data dir is open to other users"),
        "{text}"
    );
}
