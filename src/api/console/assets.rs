//! Every file of the console, embedded at build time: its path under `/console/assets/`
//! and its bytes. A test checks that each file in `assets/` is listed here.

macro_rules! files {
    ($($path:literal),* $(,)?) => {
        pub(crate) const FILES: &[(&str, &[u8])] = &[
            $(($path, include_bytes!(concat!("assets/", $path)))),*
        ];
    };
}

files![
    "index.html",
    "console.css",
    "app.js",
    "lib/api.js",
    "lib/diff.js",
    "lib/dom.js",
    "lib/markdown.js",
    "lib/sse.js",
    "lib/time.js",
    "lib/transcript.js",
    "pages/approvals.js",
    "pages/run.js",
    "pages/runs.js",
    "pages/task.js",
    "pages/tasks.js",
    // Part 2's pages.
    "pages/external_work.js",
    "pages/media.js",
    "pages/paged.js",
    "pages/policy.js",
    "pages/providers.js",
    "pages/queue.js",
    "pages/schedules.js",
    "pages/usage.js",
];
