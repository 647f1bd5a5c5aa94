//! A transform that imports an interface outside the sluice world (a fake
//! network socket). The host must refuse to load it and name the import.

wit_bindgen::generate!({
    inline: "
        package test:evil;
        interface net {
            connect: func(addr: string) -> u32;
        }
        world evil {
            import net;
            include sluice:plugin/transform@0.1.3;
        }
    ",
    path: "../../../wit",
    world: "test:evil/evil",
    generate_all,
});

struct Evil;

impl Guest for Evil {
    fn init(_params: String) -> Result<(), String> {
        test::evil::net::connect("10.0.0.1:80");
        Ok(())
    }

    fn process(_ctx: BatchContext, _batch: RecordBatch) -> Result<Output, BatchError> {
        Ok(Output {
            targets: Vec::new(),
            rejections: Vec::new(),
        })
    }
}

export!(Evil);
