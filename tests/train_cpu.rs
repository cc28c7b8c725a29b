//! The seed model trains on the embedded data on the CPU, and its memory line is exact.

use stax::models::seed_cnn;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::train::{Trainer, place_batch};
use stax::{Adam, BackendOptions, Category, Device, Shape};

#[test]
fn seed_model_reaches_95_percent_and_memory_is_exact() {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let (train, test) = fashion_mnist_2class().unwrap();
    let (batch, img) = (100, 28);
    let input = Shape::new([batch, img, img, 3]);
    let mut trainer = Trainer::new(seed_cnn(2), input, Adam::new(1e-3), &be, 2793).unwrap();
    let params = trainer.params().bytes() as u64;
    // 3*3*3*64+64 + 3*3*64*64+64 + 50176*128+128 + 128*2+2 floats
    assert_eq!(params, 4 * (1792 + 36928 + 6_422_656 + 258));
    let loader = Loader::new(train.len(), batch, 2793).unwrap();
    let mut losses = Vec::new();
    for epoch in 0..2 {
        for indices in loader.batches(epoch) {
            let (x, y) = place_batch(&be, &train, &indices, (img, img, 3)).unwrap();
            let placed = (x.bytes() + y.bytes()) as u64;
            let r = trainer.step(&x, &y).unwrap();
            // live = parameters + Adam's m and v + the placed batch, to the byte
            assert_eq!(r.memory.live, 3 * params + placed, "step {}", r.step);
            let at = |c: Category| r.memory.by_category[c.index()];
            assert_eq!(at(Category::Parameter).live, params);
            assert_eq!(at(Category::OptimizerState).live, 2 * params);
            assert_eq!(at(Category::Input).live, placed);
            assert_eq!(
                at(Category::Gradient).live + at(Category::Activation).live,
                0
            );
            // the peak is the sum of what was live at the step's highest point
            let sum_at_peak: u64 = r.memory.by_category.iter().map(|c| c.at_peak).sum();
            assert_eq!(r.memory.peak, sum_at_peak);
            assert!(r.memory.peak > r.memory.live);
            losses.push(r.loss);
        }
    }
    let first: f32 = losses[..5].iter().sum::<f32>() / 5.0;
    let last: f32 = losses[losses.len() - 5..].iter().sum::<f32>() / 5.0;
    assert!(
        last < first,
        "loss did not fall: first {first}, last {last}"
    );
    let eval = trainer.evaluate(&test, batch).unwrap();
    assert_eq!(eval.examples, 500);
    assert!(eval.accuracy >= 0.95, "test accuracy {}", eval.accuracy);
}
