'use strict';
// Preloaded into s3rver (`node --require`, see tests/servers/process.py) to close a race in
// its filesystem store that kills the server: a DELETE removes a directory it has just
// emptied while a PUT into that directory is between its mkdir and its open. The PUT's
// write stream then fails with ENOENT, an 'error' event nothing listens to, and Node exits.
// Here a PUT reads its body first, then writes with ordinary promises and redoes the mkdir
// on ENOENT; the DELETE's clean-up of empty directories stops quietly when one is already
// gone or no longer empty.
// A LIST answered 500 under many consumers (a queue test, once in a CI run): it walks the
// bucket's files while DELETEs remove them, and reads metadata files that PUTs rewrite in
// place. Here the walk skips what is gone by the time it is read, as S3 lists what exists,
// and a PUT writes each file beside it and renames it into place, so a reader sees the old
// file or the new one, never a half-written one. A failed LIST prints its error to the
// server's log. Everything else is s3rver's own code.

const crypto = require('crypto');
const fs = require('fs-extra');
const { pick, pickBy } = require('lodash');
const path = require('path');
const utils = require('s3rver/lib/utils');

function skipGone(read, gone) {
  try {
    return read();
  } catch (err) {
    if (err.code === 'ENOENT') return gone;
    throw err;
  }
}

// Replaced before the store is loaded: it takes `walk` from utils when it loads.
utils.walk = function* walk(dir, recurseFilter) {
  for (const filename of skipGone(() => fs.readdirSync(dir), [])) {
    const filePath = path.posix.join(dir, filename);
    const stats = skipGone(() => fs.statSync(filePath), null);
    if (stats === null) continue;
    if (!stats.isDirectory()) {
      yield filePath;
    } else if (!recurseFilter || recurseFilter(filePath)) {
      yield* walk(filePath, recurseFilter);
    }
  }
};

const FilesystemStore = require('s3rver/lib/stores/filesystem');
const S3Object = require('s3rver/lib/models/object');

const ATTEMPTS = 20;

async function writeAtomically(filePath, data) {
  const partial = `${filePath}.${crypto.randomBytes(6).toString('hex')}.partial`;
  await fs.writeFile(partial, data);
  await fs.rename(partial, filePath);
}

async function readBody(content) {
  if (Buffer.isBuffer(content)) return content;
  const chunks = [];
  for await (const chunk of content) chunks.push(chunk);
  return Buffer.concat(chunks);
}

FilesystemStore.prototype.putObject = async function putObject(object) {
  const body = await readBody(object.content);
  const md5 = crypto.createHash('md5').update(body).digest('hex');
  const objectPath = this.getResourcePath(object.bucket, object.key, 'object');
  for (let attempt = 1; ; attempt++) {
    try {
      await fs.mkdirp(path.dirname(objectPath));
      await writeAtomically(objectPath, body);
      await this.putMetadata(object.bucket, object.key, object.metadata, md5);
      return { size: body.length, md5 };
    } catch (err) {
      if (err.code !== 'ENOENT' || attempt >= ATTEMPTS) throw err;
    }
  }
};

FilesystemStore.prototype.deleteObject = async function deleteObject(bucket, key) {
  await Promise.all(
    ['object', 'object.md5', 'metadata.json'].map(resource =>
      fs.unlink(this.getResourcePath(bucket, key, resource)).catch(err => {
        if (err.code !== 'ENOENT') throw err;
      }),
    ),
  );
  const bucketPath = this.getBucketPath(bucket);
  const parts = key.split('/');
  parts.pop(); // the last part is in the file's name
  try {
    while (parts.length && !(await fs.readdir(path.join(bucketPath, ...parts))).length) {
      await fs.rmdir(path.join(bucketPath, ...parts));
      parts.pop();
    }
  } catch (err) {
    // Another request removed the directory, or wrote into it, first.
    if (err.code !== 'ENOENT' && err.code !== 'ENOTEMPTY') throw err;
  }
};

FilesystemStore.prototype.putMetadata = async function putMetadata(bucket, key, metadata, md5) {
  const json = {
    ...pick(metadata, S3Object.ALLOWED_METADATA),
    ...pickBy(metadata, (value, name) => name.startsWith('x-amz-meta-')),
  };
  if (md5) await writeAtomically(this.getResourcePath(bucket, key, 'object.md5'), md5);
  await writeAtomically(
    this.getResourcePath(bucket, key, 'metadata.json'),
    JSON.stringify(json, null, 2),
  );
};

const listObjects = FilesystemStore.prototype.listObjects;
FilesystemStore.prototype.listObjects = async function listLogged(bucket, options) {
  try {
    return await listObjects.call(this, bucket, options);
  } catch (err) {
    console.error('LIST failed:', err);
    throw err;
  }
};
