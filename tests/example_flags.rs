//! The examples refuse flags their model or data cannot take before anything is planned, naming
//! the flag and what would work: a `--classes` below the data's class count, an `--img` the
//! model's shapes refuse (ResNet-50's max pool at 4x4), `--img 0`, `--batch 0`.

mod common;

use common::checkpoint::{example_binary, run_example};

#[test]
fn a_flag_the_model_or_data_cannot_take_names_itself_and_what_works() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let resnet = cnn.with_file_name("resnet50");
    let cpu = ["--device", "cpu", "--max-steps", "1"];
    let cases: [(&std::path::Path, &[&str], &str); 5] = [
        (
            &cnn,
            &["--classes", "1"],
            "--classes 1: the data has 2 classes (labels 0 to 1); give at least 2",
        ),
        (
            &resnet,
            &["--img", "4"],
            "--img 4: the model cannot take 4x4 images (the smallest --img it takes is 5)",
        ),
        (
            &resnet,
            &["--classes", "0"],
            "--classes 0: the data has 2 classes",
        ),
        (
            &cnn,
            &["--img", "0"],
            "--img 0: the image size must be at least 1",
        ),
        (&cnn, &["--batch", "0"], "--batch"),
    ];
    let dir = std::env::temp_dir();
    for (bin, flags, want) in cases {
        let args: Vec<&str> = cpu.iter().chain(flags).copied().collect();
        let (ok, out) = run_example(bin, &dir, &args);
        assert!(!ok, "{args:?} should fail:\n{out}");
        assert!(out.contains(want), "{args:?}: expected {want:?} in:\n{out}");
        assert!(!out.contains("panicked"), "{args:?} panicked:\n{out}");
    }
}
