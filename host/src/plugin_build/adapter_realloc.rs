//! Gives a Go core module the allocator the WASI preview-1 adapter needs
//! before Go's runtime runs.
//!
//! The adapter allocates its state and its stack on its first WASI call,
//! which Go's runtime makes while it initialises (in the component's start
//! function): through the module's `cabi_realloc` it would re-enter Go
//! before Go can run (a `badsystemstack` throw, then endless recursion),
//! and through `memory.grow` it would take pages that Go's heap, which
//! assumes it owns all memory past its data, later writes over. So the
//! Go SDK reserves an arena in its data (`adapterArena`, found by its
//! marker) and this adds `cabi_realloc_adapter`, a bump allocator over it
//! in plain Wasm, which wit-component hands the adapter instead.
//!
//! It must not change anything else of the module: every other section is
//! copied byte for byte.

use wasm_encoder::reencode::{Reencode, RoundtripReencoder};
use wasm_encoder::{
    CodeSection, ConstExpr, ExportKind, ExportSection, Function, FunctionSection, GlobalSection,
    GlobalType, Module, RawSection, TypeSection, ValType,
};
use wasmparser::{Parser, Payload, TypeRef};

/// The first bytes of `adapterArena` in `sdk/go/abi_wasm.go` (Go's linker
/// leaves the zeros after them out of the data segment).
pub const MARKER: &[u8] = b"sluice:wasi-adapter-arena:v1";
/// Its size there.
pub const ARENA_BYTES: u32 = 256 << 10;
/// Allocation starts past the marker, so the marker stays findable.
const HEADER: u32 = 64;

/// What the first pass learns of the module.
#[derive(Default)]
struct Shape {
    arena: Option<u32>,
    imported_functions: u32,
    imported_globals: u32,
    types: u32,
    functions: u32,
    globals: u32,
}

/// `core` with `cabi_realloc_adapter` exported; an error says what is
/// missing.
pub fn add(core: &[u8]) -> Result<Vec<u8>, String> {
    let shape = shape(core)?;
    let arena = shape.arena.ok_or(
        "the Go module has no adapter arena: it was not built with the sluice Go SDK's abi_wasm.go",
    )?;
    let realloc_type = shape.types;
    let realloc_function = shape.imported_functions + shape.functions;
    let bump_global = shape.imported_globals + shape.globals;
    let mut module = Module::new();
    let mut code: Option<(CodeSection, u32)> = None;
    let reencode_error = |e| format!("re-encoding the Go module: {e:?}");
    for payload in Parser::new(0).parse_all(core) {
        let payload = payload.map_err(|e| e.to_string())?;
        match payload {
            Payload::Version { .. } | Payload::End(_) => {}
            Payload::TypeSection(reader) => {
                let mut types = TypeSection::new();
                RoundtripReencoder
                    .parse_type_section(&mut types, reader)
                    .map_err(reencode_error)?;
                types.ty().function([ValType::I32; 4], [ValType::I32]);
                module.section(&types);
            }
            Payload::FunctionSection(reader) => {
                let mut functions = FunctionSection::new();
                RoundtripReencoder
                    .parse_function_section(&mut functions, reader)
                    .map_err(reencode_error)?;
                functions.function(realloc_type);
                module.section(&functions);
            }
            Payload::GlobalSection(reader) => {
                let mut globals = GlobalSection::new();
                RoundtripReencoder
                    .parse_global_section(&mut globals, reader)
                    .map_err(reencode_error)?;
                globals.global(
                    GlobalType {
                        val_type: ValType::I32,
                        mutable: true,
                        shared: false,
                    },
                    &ConstExpr::i32_const((arena + HEADER) as i32),
                );
                module.section(&globals);
            }
            Payload::ExportSection(reader) => {
                let mut exports = ExportSection::new();
                RoundtripReencoder
                    .parse_export_section(&mut exports, reader)
                    .map_err(reencode_error)?;
                exports.export("cabi_realloc_adapter", ExportKind::Func, realloc_function);
                module.section(&exports);
            }
            Payload::CodeSectionStart { count, .. } => code = Some((CodeSection::new(), count)),
            Payload::CodeSectionEntry(body) => {
                let (section, left) = code
                    .as_mut()
                    .ok_or("a function body outside a code section")?;
                section.raw(&core[body.range()]);
                *left -= 1;
                if *left == 0 {
                    let (mut section, _) = code.take().expect("in a code section");
                    section.function(&bump_allocator(bump_global, arena + ARENA_BYTES));
                    module.section(&section);
                }
            }
            other => {
                if let Some((id, range)) = other.as_section() {
                    module.section(&RawSection {
                        id,
                        data: &core[range],
                    });
                }
            }
        }
    }
    Ok(module.finish())
}

/// Counts what indices the new items get, and finds the arena's address
/// in the data segments.
fn shape(core: &[u8]) -> Result<Shape, String> {
    let mut shape = Shape::default();
    let mut sections = (false, false, false, false);
    for payload in Parser::new(0).parse_all(core) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    match import.map_err(|e| e.to_string())?.ty {
                        TypeRef::Func(_) => shape.imported_functions += 1,
                        TypeRef::Global(_) => shape.imported_globals += 1,
                        _ => {}
                    }
                }
            }
            Payload::TypeSection(reader) => {
                shape.types = reader.count();
                sections.0 = true;
            }
            Payload::FunctionSection(reader) => {
                shape.functions = reader.count();
                sections.1 = true;
            }
            Payload::GlobalSection(reader) => {
                shape.globals = reader.count();
                sections.2 = true;
            }
            Payload::ExportSection(_) => sections.3 = true,
            Payload::DataSection(reader) => {
                for data in reader {
                    let data = data.map_err(|e| e.to_string())?;
                    if let Some(at) = marker_address(&data) {
                        shape.arena = Some(at);
                    }
                }
            }
            _ => {}
        }
    }
    if sections != (true, true, true, true) {
        return Err("the Go module lacks a type, function, global or export section".into());
    }
    Ok(shape)
}

/// The address of [`MARKER`] in an active segment of memory 0 at a
/// constant offset.
fn marker_address(data: &wasmparser::Data<'_>) -> Option<u32> {
    let wasmparser::DataKind::Active {
        memory_index: 0,
        offset_expr,
    } = &data.kind
    else {
        return None;
    };
    let mut ops = offset_expr.get_operators_reader();
    let wasmparser::Operator::I32Const { value } = ops.read().ok()? else {
        return None;
    };
    let at = data.data.windows(MARKER.len()).position(|w| w == MARKER)?;
    Some(value as u32 + at as u32)
}

/// `cabi_realloc_adapter(old, old_size, align, size) -> ptr`: the next
/// `align`-aligned `size` bytes of the arena (global `bump` is the next
/// free byte, `end` the arena's end). The adapter only ever allocates
/// anew; a reallocation or running past the end traps.
fn bump_allocator(bump: u32, end: u32) -> Function {
    let mut f = Function::new([(1, ValType::I32)]);
    let (old, align, size, at) = (0, 2, 3, 4);
    f.instructions()
        .local_get(old)
        .if_(wasm_encoder::BlockType::Empty)
        .unreachable()
        .end()
        // No size past the arena's (so `at + size` cannot wrap).
        .local_get(size)
        .i32_const(ARENA_BYTES as i32)
        .i32_gt_u()
        .if_(wasm_encoder::BlockType::Empty)
        .unreachable()
        .end()
        // at = (bump + align - 1) & -align
        .global_get(bump)
        .local_get(align)
        .i32_add()
        .i32_const(1)
        .i32_sub()
        .i32_const(0)
        .local_get(align)
        .i32_sub()
        .i32_and()
        .local_tee(at)
        .local_get(size)
        .i32_add()
        .i32_const(end as i32)
        .i32_gt_u()
        .if_(wasm_encoder::BlockType::Empty)
        .unreachable()
        .end()
        .local_get(at)
        .local_get(size)
        .i32_add()
        .global_set(bump)
        .local_get(at)
        .end();
    f
}
