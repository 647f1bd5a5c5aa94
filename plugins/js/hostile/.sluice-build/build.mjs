import { componentize } from "/root/.cache/sluice/toolchains/js/node_modules/@bytecodealliance/componentize-js/src/componentize.js";
import { writeFile } from 'node:fs/promises';
const [source, wit, out] = process.argv.slice(2);
const { component } = await componentize({ sourcePath: source, witPath: wit, worldName: 'transform', disableFeatures: ['http', 'fetch-event'] });
await writeFile(out, component);
