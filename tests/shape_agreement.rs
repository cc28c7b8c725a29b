//! stax's `_CheckShapeAgreement` as a property test: for random layers and random `serial`
//! stacks, the shape `init` returns equals the shape `apply` produces, in both modes.

use proptest::prelude::*;
use stax::layers::{Cx, Value};
use stax::{
    Backend, BackendOptions, Category, Collect, Conv, Dense, Device, Flatten, Layer, Padding,
    ParamSource, Relu, Rng, Serial, Shape, Tensor, Tree, init_params,
};
use std::sync::{Arc, OnceLock};

fn cpu() -> Arc<dyn Backend> {
    static CPU: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    CPU.get_or_init(|| Device::Cpu.open(&BackendOptions::default()).unwrap())
        .clone()
}

fn conv() -> impl Strategy<Value = Conv> {
    (
        1usize..4,
        1usize..4,
        1usize..4,
        1usize..3,
        1usize..3,
        prop::bool::ANY,
    )
        .prop_map(|(c, kh, kw, sh, sw, same)| {
            let padding = if same { Padding::Same } else { Padding::Valid };
            Conv::new(c, (kh, kw), (sh, sw), padding)
        })
}

/// `Some(conv)` or `None` for a Relu.
fn layer() -> impl Strategy<Value = Option<Conv>> {
    prop::option::of(conv())
}

fn agree(model: &dyn Layer, input: &Shape, seed: u64) -> Result<(), TestCaseError> {
    let be = cpu();
    let shapes = Tree::leaf(input.clone());
    let source = ParamSource::Random(&mut Rng::new(seed));
    let (out, params) = match init_params(model, &shapes, &be, source) {
        Ok(v) => v,
        // VALID kernels larger than the input are rejected by init, before any memory is used.
        Err(e) => {
            prop_assert!(e.to_string().contains("VALID"), "{}", e);
            return Ok(());
        }
    };
    for train in [true, false] {
        let data = vec![0.5f32; input.numel()];
        let x = Tensor::from_slice(&be, &data, input.clone(), Category::Input).unwrap();
        let mut sink = Collect::new();
        let mut cx = if train {
            Cx::train(&be, &mut sink)
        } else {
            Cx::eval(&be)
        };
        let (y, _): (Value, _) = model.apply(&params, Tree::leaf(x), &mut cx).unwrap();
        prop_assert_eq!(y.map(|t| t.shape().clone()), out.clone());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn conv_shapes_agree(c in conv(), n in 1usize..3, h in 1usize..9, w in 1usize..9, ci in 1usize..4, seed in 0u64..1000) {
        agree(&c, &Shape::new([n, h, w, ci]), seed)?;
    }

    #[test]
    fn serial_stacks_agree(layers in prop::collection::vec(layer(), 0..4), dense in 1usize..5, n in 1usize..3, h in 3usize..9, seed in 0u64..1000) {
        let mut all: Vec<Box<dyn Layer>> = layers
            .into_iter()
            .map(|l| l.map_or(Box::new(Relu) as Box<dyn Layer>, |c| Box::new(c) as Box<dyn Layer>))
            .collect();
        all.push(Box::new(Flatten));
        all.push(Box::new(Dense(dense)));
        agree(&Serial(all), &Shape::new([n, h, h, 2]), seed)?;
    }
}
